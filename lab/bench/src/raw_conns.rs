//! PostgreSQL connections the raw entries keep between statements, shared by the raw
//! round trip (`sys_pg`) and the raw handoff floor (`floor`).

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::op::Res;

/// Connections kept between statements with nothing sent in between (as pgbench keeps its
/// clients' and as the backend keeps its lock calls'): one round trip per statement, the
/// raw entries' floor. Opened on demand, one per concurrent task at most.
pub(crate) struct RawConns {
    url: String,
    idle: std::sync::Mutex<Vec<PgConnection>>,
}

impl RawConns {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            idle: std::sync::Mutex::default(),
        }
    }

    pub(crate) async fn take(&self) -> Res<PgConnection> {
        let idle = self.idle.lock().expect("raw connections").pop();
        match idle {
            Some(conn) => Ok(conn),
            None => Ok(PgConnection::connect(&self.url).await?),
        }
    }

    /// Back for the next statement; only after one that succeeded.
    pub(crate) fn give_back(&self, conn: PgConnection) {
        self.idle.lock().expect("raw connections").push(conn);
    }
}

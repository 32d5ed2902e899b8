//! The child's side of `child`: measures one backend's scale, today and with the
//! prototype, and prints the rows for the parent.

use crate::args::Plan;
use crate::child::Job;
use crate::common::TTL;
use crate::op::Res;
use crate::system::{Ctx, Kind, System};
use crate::{proto, scale};

/// In the child: measures anylock today and the prototype, and prints the rows as JSON.
///
/// # Errors
/// When the backend cannot be reached or a measurement fails outright.
pub(crate) async fn run(job: &str) -> Res<()> {
    let job: Job = serde_json::from_str(job)?;
    let kind = Kind::from_name(&job.kind).ok_or_else(|| format!("unknown backend {}", job.kind))?;
    let plan = if job.smoke {
        Plan::smoke()
    } else {
        Plan::full()
    };
    let ctx = Ctx {
        run: job.run,
        ttl: TTL,
        gcs_server: None,
    };
    let system = System::connect(kind, &job.url, &ctx).await?;
    let prices = scale::Prices {
        refresh: job.per_refresh,
        refresh_many: job.per_refresh_many,
    };
    let mut rows = vec![scale::ours(&system, &ctx, &plan, prices).await?];
    rows.extend(proto::run(&system, &ctx, &plan).await?);
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}

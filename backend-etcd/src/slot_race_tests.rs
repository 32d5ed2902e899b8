//! The take Txn raced by hand (it needs the crate's internals, so it lives here, against
//! the shared cluster): what another contender writes between an attempt's Range and its
//! Txn, which the Range could not see, is checked by the Txn itself.

use lockcore::{Identity, LockName};

use crate::EtcdConfig;
use crate::client::{EtcdClient, Taken};
use crate::keys::{Layout, encode_value};

async fn setup(what: &str) -> Option<(EtcdClient, Layout, i64)> {
    let endpoints = test_kit::env::require("ANYLOCK_TEST_ETCD_ENDPOINTS", "etcd")?;
    let endpoints: Vec<String> = endpoints.split(',').map(|s| s.trim().to_owned()).collect();
    let prefix = format!("anylock-test/{what}-{:016x}/", rand::random::<u64>());
    let config = EtcdConfig::new(&endpoints)
        .expect("endpoints")
        .with_prefix(&prefix);
    let material = config.load_tls().expect("no TLS");
    let client = EtcdClient::new(&config, &material).expect("client");
    // Every key written here goes with this lease.
    let (lease, _) = client.grant(30).await.expect("lease");
    Some((client, Layout::new(config.prefix()), lease))
}

/// A slot of limit 3 created after a limit-2 attempt read an empty semaphore makes that
/// attempt's Txn write nothing (and return what it read): mixed limits never coexist.
/// With one limit, a take whose first offered slot was taken meanwhile takes the next,
/// and one whose every offered slot was taken writes nothing.
#[tokio::test]
async fn the_take_txn_checks_what_the_read_could_not_see() {
    let Some((client, layout, lease)) = setup("slot-race").await else {
        return;
    };
    let s = LockName::new("raced").expect("name");
    let sem = layout.semaphore_prefix(&s);
    let (three, two) = (layout.limit_prefix(&s, 3), layout.limit_prefix(&s, 2));
    let value = encode_value(&Identity::unique(), None);
    let take = |limit: &[u8], keys: Vec<Vec<u8>>| {
        let (client, sem, limit, value) = (&client, sem.clone(), limit.to_vec(), value.clone());
        async move { client.take_slot((&sem, &limit), &keys, &value, lease).await }
    };
    let won = take(&three, vec![layout.slot_key(&s, 3, 0)])
        .await
        .expect("take");
    assert!(matches!(won, Taken::Won { at: 0, .. }), "{won:?}");
    let both = vec![layout.slot_key(&s, 2, 0), layout.slot_key(&s, 2, 1)];
    match take(&two, both).await.expect("take") {
        Taken::Lost { kvs } => {
            assert_eq!(kvs.len(), 1);
            assert_eq!(kvs[0].key, layout.slot_key(&s, 3, 0));
        }
        won => panic!("a slot of limit 2 beside one of limit 3: {won:?}"),
    }
    assert!(client.slots(&two).await.expect("read").is_empty());
    let next = vec![layout.slot_key(&s, 3, 0), layout.slot_key(&s, 3, 1)];
    let won = take(&three, next).await.expect("take");
    assert!(matches!(won, Taken::Won { at: 1, .. }), "{won:?}");
    let taken = vec![layout.slot_key(&s, 3, 0), layout.slot_key(&s, 3, 1)];
    match take(&three, taken).await.expect("take") {
        Taken::Lost { kvs } => assert_eq!(kvs.len(), 2),
        won => panic!("an offered slot taken twice: {won:?}"),
    }
    assert_eq!(client.slots(&sem).await.expect("read").len(), 2);
    client.revoke(lease).await.expect("revoke");
}

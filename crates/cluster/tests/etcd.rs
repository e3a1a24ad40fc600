//! The cluster's state on a real 3-member etcd: leases, names, ownership, secrets, quorum.

use std::time::{Duration, Instant};

use forkbox_cluster::{Cluster, Config, Error, NodeRecord, SandboxView, TokenRecord};
use forkbox_test_infra::etcd::EtcdCluster;

const SECRET: &str = "a test cluster secret, long enough";

fn config(etcd: &EtcdCluster, node: &str, node_id: &str) -> Config {
    Config {
        endpoints: etcd.endpoints(),
        node: node.into(),
        advertise: format!("http://127.0.0.1:1/{node}"),
        secret: SECRET.into(),
        lease_secs: 2,
        node_id: node_id.into(),
        tls: None,
    }
}

fn record(c: &Config) -> NodeRecord {
    NodeRecord {
        name: c.node.clone(),
        node_id: c.node_id.clone(),
        advertise: c.advertise.clone(),
        mem_free_mib: 4096,
        disk_free_mib: 4096,
        ..NodeRecord::default()
    }
}

fn view(id: &str) -> SandboxView {
    serde_json::from_value(serde_json::json!({
        "id": id, "image": "python@1", "accel": {"accel": "tcg", "reason": "test"},
        "cpus": 1, "memory_mib": 512, "guest_kernel": "6.1", "boot_ms": 1,
        "labels": {}, "created_unix": 1, "expires_unix": null, "state": "running"
    }))
    .expect("a sandbox view")
}

async fn joined(etcd: &EtcdCluster, node: &str) -> Cluster {
    let cfg = config(etcd, node, &format!("id-{node}"));
    let c = Cluster::connect(cfg.clone()).await.expect("connects");
    c.join(&record(&cfg)).await.expect("joins");
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_leases_ownership_and_quorum_on_a_real_etcd() {
    let mut etcd = EtcdCluster::start(3, "127.0.0.1");
    let a = joined(&etcd, "a").await;
    let b = joined(&etcd, "b").await;
    let keeper = {
        let a = a.clone();
        tokio::spawn(async move { a.keep_alive().await })
    };
    let names = |v: Vec<NodeRecord>| v.into_iter().map(|n| n.name).collect::<Vec<_>>();
    // Member-local reads: a member that lags sees b a moment later; the leader at once.
    assert_eq!(names(a.nodes_fresh().await.expect("nodes")), ["a", "b"]);
    assert!(
        wait_async(Duration::from_secs(2), || async {
            names(a.nodes().await.unwrap_or_default()) == ["a", "b"]
        })
        .await
    );

    // A name held by a live node of another identity is refused, naming it; the same node
    // restarting (same id) takes its name over.
    let thief = Cluster::connect(config(&etcd, "a", "someone-else"))
        .await
        .expect("connects");
    let e = thief
        .join(&record(thief.config()))
        .await
        .expect_err("refused");
    assert!(matches!(e, Error::NameTaken { .. }), "{e}");
    assert!(e.to_string().contains("http://127.0.0.1:1/a"), "{e}");
    let again = Cluster::connect(config(&etcd, "b", "id-b"))
        .await
        .expect("connects");
    again
        .join(&record(again.config()))
        .await
        .expect("a restart of b takes its name");

    // Another secret: refused at connect.
    let mut other = config(&etcd, "c", "id-c");
    other.secret = "another secret entirely, also long".into();
    let e = Cluster::connect(other).await.err().expect("refused");
    assert!(matches!(e, Error::SecretMismatch { .. }), "{e}");

    // Ownership: create-if-absent; the other node cannot take it.
    a.own(&view("s1")).await.expect("a owns s1");
    let e = b.own(&view("s1")).await.expect_err("b cannot");
    assert!(
        matches!(e, Error::AlreadyOwned { ref node, .. } if node == "a"),
        "{e}"
    );
    assert_eq!(
        b.owner("s1").await.expect("read").map(|o| o.node),
        Some("a".into())
    );
    b.forget("s1").await.expect("not b's to forget: a no-op");
    assert!(a.owner("s1").await.expect("read").is_some());

    // Tokens: cluster-wide hashes, revocation seen by every node.
    let t = TokenRecord {
        name: "ci".into(),
        sha256: "ab".repeat(32),
        created_unix: 1,
    };
    a.add_token(&t).await.expect("added");
    assert_eq!(b.tokens_fresh().await.expect("tokens").len(), 1);
    assert_eq!(b.revoke_tokens("ci").await.expect("revoked"), 1);
    assert!(a.tokens_fresh().await.expect("tokens").is_empty());
    assert!(
        wait_async(Duration::from_secs(1), || async {
            a.tokens().await.is_ok_and(|t| t.is_empty())
        })
        .await,
        "a member-local read still saw the revoked token after a second"
    );

    // A node whose lease is not kept alive drops out within the lease (2 s here).
    let dropped = Instant::now();
    assert!(
        wait_async(Duration::from_secs(5), || async {
            names(a.nodes().await.unwrap_or_default()) == ["a"]
        })
        .await,
        "b's record outlived its lease"
    );
    assert!(dropped.elapsed() < Duration::from_secs(4));
    // Its ownership record stays: the sandbox is listed lost, not forgotten.
    assert!(a.owner("s1").await.expect("read").is_some());

    // Drain is seen in the node list.
    a.drain("a", true).await.expect("drained");
    assert!(
        wait_async(Duration::from_secs(2), || async {
            a.nodes().await.is_ok_and(|n| n[0].drained)
        })
        .await
    );
    a.drain("a", false).await.expect("undrained");

    // Given one endpoint of three, a node learns the others from etcd's member list, and
    // keeps working when the one it was given stops.
    let mut one = config(&etcd, "d", "id-d");
    one.endpoints = vec![etcd.endpoints()[0].clone()];
    let d = Cluster::connect(one).await.expect("connects");
    let learned = d.sync_endpoints().await.expect("member list");
    assert_eq!(learned.len(), 2, "{learned:?}");
    etcd.stop(0);
    d.require_quorum()
        .await
        .expect("reached through a learned member");
    etcd.restart(0);
    assert!(
        wait_async(Duration::from_secs(20), || async { etcd.healthy() }).await,
        "member 0 did not come back"
    );

    // One member down, the leader: the members elect another while the calls wait, and
    // everything works (calls made at once, not after the election).
    let leader = etcd.leader().expect("a leader");
    etcd.stop(leader);
    let t0 = Instant::now();
    a.own(&view("s2"))
        .await
        .expect("owns while a new leader is elected");
    a.require_quorum().await.expect("quorum with two of three");
    println!("leader killed to a write done: {:?}", t0.elapsed());
    etcd.restart(leader);
    assert!(
        wait_async(Duration::from_secs(20), || async { etcd.healthy() }).await,
        "member {leader} did not come back"
    );
    // One member down, a follower (the leader stays): everything works.
    let leader = etcd.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    etcd.stop(follower);
    a.own(&view("s4")).await.expect("owns with two of three");
    // Two down: what needs quorum fails within the deadline, member-local reads still answer.
    let second = (follower + 1) % 3;
    etcd.stop(second);
    let t0 = Instant::now();
    let e = a.own(&view("s3")).await.expect_err("no quorum");
    assert!(matches!(e, Error::Unavailable { .. }), "{e}");
    assert!(
        t0.elapsed() < forkbox_cluster::DEADLINE + Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        e.to_string().contains("running sandboxes still answer"),
        "{e}"
    );
    // Back: works again, same handle.
    etcd.restart(follower);
    etcd.restart(second);
    assert!(
        wait_async(Duration::from_secs(20), || async {
            a.own(&view("s3")).await.is_ok()
        })
        .await,
        "quorum came back but writes still fail: {}",
        etcd.logs()
    );
    keeper.abort();
}

async fn wait_async<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// etcd over TLS with client certificates (`--client-cert-auth`): a node with a certificate of
/// the cluster CA joins; one of another CA, or none, is not let in, and says why.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_over_tls_takes_only_the_cluster_cas_certificates() {
    use forkbox_cluster::tls;
    let d = tempfile::tempdir().expect("a temporary directory");
    let (ca, other_ca) = (d.path().join("ca"), d.path().join("other-ca"));
    tls::init_ca(&ca).expect("a CA");
    tls::init_ca(&other_ca).expect("another CA");
    let req = |node: &str| tls::Request {
        node: node.into(),
        hosts: vec!["127.0.0.1".into()],
        not_after_unix: forkbox_cluster::now_ms() as i64 / 1000 + 86_400,
    };
    let (etcd_dir, a_dir, x_dir) = (
        d.path().join("etcd"),
        d.path().join("a"),
        d.path().join("x"),
    );
    tls::issue(&ca, &req("etcd"), &etcd_dir).expect("etcd's certificate");
    tls::issue(&ca, &req("a"), &a_dir).expect("a's certificate");
    tls::issue(&other_ca, &req("a"), &x_dir).expect("another cluster's a");
    let etcd = EtcdCluster::start_with(
        3,
        "127.0.0.1",
        None,
        Some(forkbox_test_infra::etcd::EtcdTls {
            ca: etcd_dir.join(tls::CA_FILE),
            cert: etcd_dir.join(tls::CERT_FILE),
            key: etcd_dir.join(tls::KEY_FILE),
        }),
    );
    assert!(etcd.endpoints()[0].starts_with("https://"));

    let mut cfg = config(&etcd, "a", "id-a");
    let Err(e) = Cluster::connect(cfg.clone()).await else {
        panic!("an https etcd without TLS given must be refused");
    };
    assert!(e.to_string().contains("--cluster-tls"), "{e}");

    cfg.tls = Some(tls::Identity::load(&a_dir, "a").expect("a's identity"));
    let c = Cluster::connect(cfg.clone())
        .await
        .expect("connects over TLS");
    c.join(&record(&cfg)).await.expect("joins over TLS");
    let names: Vec<String> = c
        .nodes_fresh()
        .await
        .expect("nodes")
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, ["a"]);

    // Another cluster's certificate (its CA beside it, so it loads): etcd's server certificate
    // is not of that CA, and etcd would not take the client's either.
    let mut other = config(&etcd, "b", "id-b");
    other.tls = Some(tls::Identity::load(&x_dir, "a").expect("loads against its own CA"));
    other.node = "a".into();
    let refused = match Cluster::connect(other.clone()).await {
        Err(e) => e.to_string(),
        Ok(c) => c
            .join(&record(&other))
            .await
            .expect_err("another cluster's node is not let in")
            .to_string(),
    };
    assert!(refused.contains("etcd"), "{refused}");
}

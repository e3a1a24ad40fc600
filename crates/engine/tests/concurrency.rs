//! Many sandboxes at once through the engine's API (the daemon's code path). Costs 20 restores
//! from the shared template (~0.25 s each) and 100 commands spread over them: ~1 min on 2 cores.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;

use forkbox_engine::api::{ops, CreateRequest, Engine, ExecRequest};
use forkbox_test_infra as infra;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sandboxes_exec_in_a_loop_at_once_without_failures() {
    let (_, cfg) = infra::sandbox_setup("python-bookworm");
    let paths = infra::isolated_home("twenty");
    let engine = Arc::new(Engine::new(paths.clone()));
    let mut ids = Vec::new();
    for _ in 0..20 {
        let request = CreateRequest {
            image: Some(cfg.image.to_string()),
            memory_mib: Some(512),
            ..Default::default()
        };
        let v = engine.call(ops::Create { request }).await.expect("create");
        ids.push(v.info.id);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (n, id) in ids.iter().enumerate() {
        let (engine, id) = (engine.clone(), id.clone());
        tasks.spawn(async move {
            for round in 0..5 {
                let x = engine
                    .call(ops::Exec {
                        id: id.clone(),
                        request: ExecRequest {
                            shell: Some(format!("echo $(hostname) {n} {round}")),
                            timeout_secs: Some(300),
                            ..Default::default()
                        },
                    })
                    .await
                    .unwrap_or_else(|e| panic!("exec in {id}: {e}"));
                assert_eq!(x.exit_code, 0, "{id}: {}", x.stderr);
                assert_eq!(x.stdout, format!("{id} {n} {round}\n"));
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    for id in ids {
        engine.call(ops::Delete { id }).await.unwrap();
    }
    // The warm pool (restored copies kept ready) goes with the engine's shutdown.
    engine.shutdown().await;
    assert!(
        infra::run_entries(&paths).is_empty(),
        "{:?}",
        infra::run_entries(&paths)
    );
}

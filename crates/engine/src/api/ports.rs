//! Port forwards: a host listener per forward, held by the sandbox's entry (gone with it, and
//! asleep with it when use wakes it); each connection it accepts is carried to the guest's
//! port by the sandbox's tunnels, and holds the sandbox awake while it is open.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

use super::{Deleted, Engine, EngineError, PortRequest, PortView};
use crate::activity::Busy;
use crate::net::HostNet;

/// Where a forward's connections go.
#[derive(Clone)]
enum Target {
    /// Sandbox `id` of the daemon's engine, found (and woken if it sleeps) per connection.
    Engine(Weak<Engine>, String),
    /// One VM's tunnels, for an engine no daemon holds (its forwards end with a hibernation).
    Fixed(Arc<HostNet>, Arc<crate::activity::Activity>),
}

impl Target {
    /// The tunnels to carry one connection, the sandbox held busy meanwhile.
    async fn resolve(&self) -> Result<(Arc<HostNet>, Busy), String> {
        match self {
            Target::Fixed(net, activity) => Ok((net.clone(), activity.hold())),
            Target::Engine(engine, id) => {
                let engine = engine.upgrade().ok_or("the daemon is stopping")?;
                let (sandbox, _) = engine.get(id).await.map_err(|e| e.to_string())?;
                let client = sandbox.client();
                Ok((client.net.clone(), client.activity.hold()))
            }
        }
    }
}

/// Most forwards one sandbox may have at once.
pub const MAX_PORTS: usize = 32;

/// A forward in force: its listener's task ends when this is dropped (soon after), or when
/// [`Forward::end`] returns (the port is free then).
pub(super) struct Forward {
    pub view: PortView,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Forward {
    /// Stops the listener and waits until it is closed.
    pub async fn end(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    /// Starts a forward from a host port to the guest's `guest_port`.
    pub(super) async fn forward_port(
        &self,
        id: &str,
        r: PortRequest,
    ) -> Result<PortView, EngineError> {
        if r.guest_port == 0 {
            return Err(EngineError::BadRequest(
                "guest_port: give a port from 1 to 65535".into(),
            ));
        }
        let address = r.address.as_deref().unwrap_or("127.0.0.1");
        let ip: IpAddr = address.parse().map_err(|_| {
            EngineError::BadRequest(format!(
                "address {address:?}: give an IP address of this host (127.0.0.1, 0.0.0.0, ::1)"
            ))
        })?;
        let (sandbox, _) = self.get(id).await?;
        let bind = SocketAddr::new(ip, r.host_port.unwrap_or(0));
        let listener = tokio::net::TcpListener::bind(bind).await.map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "is in use: choose another host port, or leave it out for a free one".into()
                }
                std::io::ErrorKind::PermissionDenied => {
                    "needs privileges this daemon lacks: choose a port above 1023".into()
                }
                _ => format!("cannot be listened on: {e}"),
            };
            EngineError::BadRequest(format!("host port {bind} {why}"))
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| EngineError::Internal(format!("a listener without an address: {e}")))?;
        let host = match local.ip() {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        let view = PortView {
            guest_port: r.guest_port,
            host_port: local.port(),
            address: local.ip().to_string(),
            url: format!("http://{host}:{}/", local.port()),
            preview_url: None,
        };
        let target = match self.me.get() {
            Some(me) => Target::Engine(me.clone(), id.to_string()),
            None => Target::Fixed(
                sandbox.client().net.clone(),
                sandbox.client().activity.clone(),
            ),
        };
        let (guest_port, who) = (r.guest_port, id.to_string());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors, say: wait a moment rather than spin.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let (target, who) = (target.clone(), who.clone());
                tokio::spawn(async move {
                    let carried = match target.resolve().await {
                        Ok((net, _busy)) => net.forward(guest_port, stream).await,
                        Err(why) => Err(why),
                    };
                    if let Err(why) = carried {
                        tracing::debug!("{who}: a connection to guest port {guest_port}: {why}");
                    }
                });
            }
        });
        let forward = Forward {
            view: view.clone(),
            task: Some(task),
        };
        let map = self.sandboxes.read().await;
        let entry = map
            .get(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
        let mut ports = lock(&entry.ports);
        if ports.len() >= MAX_PORTS {
            return Err(EngineError::BadRequest(format!(
                "{id} has {MAX_PORTS} port forwards already; close one first"
            )));
        }
        ports.push(forward);
        tracing::info!(
            "{id}: port forward {}:{} -> guest port {}",
            view.address,
            view.host_port,
            view.guest_port
        );
        Ok(view)
    }

    /// A connection to the guest's `guest_port` of sandbox `id`, for a proxy of the daemon's
    /// own (a preview URL): this end of a loopback pair whose other end is carried to the
    /// guest as a forward's connection is. A port nobody listens on resets it.
    pub async fn connect_port(
        &self,
        id: &str,
        guest_port: u16,
    ) -> Result<tokio::net::TcpStream, EngineError> {
        let sandbox = self.sandbox(id).await?;
        let io = |e: std::io::Error| EngineError::Internal(format!("a loopback connection: {e}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let ours = tokio::net::TcpStream::connect(addr).await.map_err(io)?;
        let mine = ours.local_addr().map_err(io)?;
        // Only the connection just made (nothing else on the host can have its address).
        let theirs = loop {
            let (s, peer) = listener.accept().await.map_err(io)?;
            if peer == mine {
                break s;
            }
        };
        let net = sandbox.client().net.clone();
        let busy = sandbox.client().activity.hold();
        let who = id.to_string();
        tokio::spawn(async move {
            let _busy = busy;
            if let Err(why) = net.forward(guest_port, theirs).await {
                tracing::debug!("{who}: a preview of guest port {guest_port}: {why}");
            }
        });
        Ok(ours)
    }

    /// The forwards of sandbox `id`.
    pub(super) async fn ports(&self, id: &str) -> Result<Vec<PortView>, EngineError> {
        if let Some(s) = self.sleepers.read().await.get(id) {
            return Ok(s.ports.iter().map(|f| f.view.clone()).collect());
        }
        let map = self.sandboxes.read().await;
        let entry = map
            .get(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
        let ports = lock(&entry.ports);
        Ok(ports.iter().map(|f| f.view.clone()).collect())
    }

    /// Ends the forward of sandbox `id` listening on `host_port` (its port free on return).
    pub(super) async fn close_port(
        &self,
        id: &str,
        host_port: u16,
    ) -> Result<Deleted, EngineError> {
        let asleep = {
            let mut sleepers = self.sleepers.write().await;
            sleepers.get_mut(id).map(|s| {
                let at = s.ports.iter().position(|f| f.view.host_port == host_port);
                at.map(|i| s.ports.remove(i))
            })
        };
        let closed = match asleep {
            Some(closed) => closed,
            None => {
                let map = self.sandboxes.read().await;
                let entry = map
                    .get(id)
                    .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
                let mut ports = lock(&entry.ports);
                let at = ports.iter().position(|f| f.view.host_port == host_port);
                at.map(|i| ports.remove(i))
            }
        };
        let Some(forward) = closed else {
            return Err(EngineError::BadRequest(format!(
                "{id} has no port forward on host port {host_port}"
            )));
        };
        forward.end().await;
        Ok(Deleted {
            deleted: format!("{id}:{host_port}"),
        })
    }

    /// Ends every forward of a sandbox that goes.
    pub(super) async fn end_ports(ports: &std::sync::Mutex<Vec<Forward>>) {
        let all = std::mem::take(&mut *lock(ports));
        for f in all {
            f.end().await;
        }
    }
}

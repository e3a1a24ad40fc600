//! The tunnels and the policy, without a VM.
#![allow(clippy::unwrap_used)]

use super::*;
use std::net::IpAddr;

/// A host's end of an agent channel, and the guest's end of it.
fn host_and_guest() -> (Arc<HostNet>, tokio::net::UnixStream) {
    let (host, guest) = tokio::net::UnixStream::pair().unwrap();
    let (_rd, wr) = host.into_split();
    let net = Arc::new(HostNet::new(Arc::new(tokio::sync::Mutex::new(wr))));
    (net, guest)
}

/// The guest's agent sends `data` on `tunnel`.
async fn guest_sends(net: &Arc<HostNet>, tunnel: u32, data: &[u8]) {
    let msg = forkbox_protocol::AgentMsg::TunnelData {
        tunnel,
        data: data.to_vec(),
    };
    net.on_agent(msg).await.unwrap();
}

/// Frames the guest end of `guest` has been sent within `wait`.
async fn frames_for_guest(guest: &mut tokio::net::UnixStream, wait: Duration) -> Vec<HostMsg> {
    let mut dec = forkbox_protocol::FrameDecoder::new();
    let mut said = Vec::new();
    let mut bytes = vec![0u8; 64 * 1024];
    let end = tokio::time::Instant::now() + wait;
    while let Ok(Ok(n)) = tokio::time::timeout_at(end, guest.read(&mut bytes)).await {
        if n == 0 {
            break;
        }
        dec.push(&bytes[..n]);
        while let Some(f) = dec.next_frame().unwrap() {
            said.push(forkbox_protocol::decode::<HostMsg>(&f).unwrap());
        }
    }
    said
}

fn allow(list: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        internet: false,
        allow: list.iter().map(|s| s.to_string()).collect(),
        deny: Vec::new(),
    }
}

#[test]
fn allow_lists_match_names_subdomains_and_ports() {
    let p = allow(&[
        "pypi.org",
        "*.pythonhosted.org",
        "10.1.2.3:8080",
        "[fd00::1]:9000",
    ]);
    p.validate().unwrap();
    assert!(p.permits_name("pypi.org", 443).is_ok());
    assert!(p.permits_name("PyPI.org.", 80).is_ok());
    assert!(p.permits_name("pypi.org", 22).is_err());
    assert!(p.permits_name("evil-pypi.org", 443).is_err());
    assert!(p.permits_name("files.pythonhosted.org", 443).is_ok());
    assert!(p.permits_name("pythonhosted.org", 443).is_err());
    assert!(p.permits_name("10.1.2.3", 8080).is_ok());
    assert!(p.permits_name("10.1.2.3", 80).is_err());
    assert!(p.permits_name("fd00::1", 9000).is_ok());
    assert!(NetworkPolicy::default()
        .permits_name("pypi.org", 443)
        .is_err());
    let any = NetworkPolicy {
        internet: true,
        allow: vec![],
        deny: Vec::new(),
    };
    assert!(any.permits_name("example.org", 22).is_ok());
}

#[test]
fn bad_policies_say_what_is_wrong() {
    assert_eq!(
        allow(&["pypi.org/simple"]).validate(),
        Err(PolicyError::BadEntry("pypi.org/simple".into()))
    );
    assert!(allow(&["host:99999"]).validate().is_err());
    assert!(allow(&[""]).validate().is_err());
    let both = NetworkPolicy {
        internet: true,
        allow: vec!["pypi.org".into()],
        deny: Vec::new(),
    };
    assert_eq!(both.validate(), Err(PolicyError::Both));
}

/// Deny entries narrow the open internet by name, address or network (every port unless one
/// is given); an allow entry that also matches wins; a name that resolves into a denied network
/// is refused by address, naming the entry.
#[test]
fn deny_lists_narrow_the_internet_and_allow_entries_win() {
    let p = NetworkPolicy {
        internet: true,
        allow: vec!["10.9.0.7/32".into(), "ok.example.org".into()],
        deny: vec![
            "10.9.0.0/24".into(),
            "*.example.org".into(),
            "bad.test:22".into(),
        ],
    };
    p.validate().unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // By name, before resolving.
    let e = p.permits_name("x.example.org", 8080).unwrap_err();
    assert!(e.contains("*.example.org"), "{e}");
    assert!(p.permits_name("ok.example.org", 443).is_ok());
    assert!(p.permits_name("bad.test", 22).is_err());
    assert!(p.permits_name("bad.test", 443).is_ok());
    assert!(p.permits_name("pypi.org", 443).is_ok());
    // By address: the denied network, its allowed host, a name resolving into it.
    let e = p
        .permits_address("10.9.0.5", ip("10.9.0.5"), 5000)
        .unwrap_err();
    assert!(e.contains("10.9.0.0/24"), "{e}");
    assert!(p.permits_address("10.9.0.7", ip("10.9.0.7"), 5000).is_ok());
    let e = p
        .permits_address("inside.test", ip("10.9.0.9"), 443)
        .unwrap_err();
    assert!(e.contains("inside.test") && e.contains("10.9.0.9"), "{e}");
    assert!(p
        .permits_address("pypi.org", ip("151.101.0.223"), 443)
        .is_ok());
    // An allow list may name a network (every port), reached by address or by a name in it.
    let net = allow(&["10.9.0.0/24"]);
    net.validate().unwrap();
    assert!(net.permits_name("10.9.0.5", 5000).is_ok());
    assert!(net.permits_name("10.9.1.5", 5000).is_err());
    assert!(net.permits_name("inside.test", 443).is_ok());
    assert!(net
        .permits_address("inside.test", ip("10.9.0.9"), 5000)
        .is_ok());
    assert!(net
        .permits_address("outside.test", ip("10.9.1.9"), 443)
        .is_err());
    // Deny entries need the internet; bad ones are named.
    let lone = NetworkPolicy {
        internet: false,
        allow: vec!["pypi.org".into()],
        deny: vec!["10.0.0.0/8".into()],
    };
    assert_eq!(lone.validate(), Err(PolicyError::DenyWithoutInternet));
    let bad = NetworkPolicy {
        internet: true,
        allow: Vec::new(),
        deny: vec!["10.0.0.0/99".into()],
    };
    assert_eq!(
        bad.validate(),
        Err(PolicyError::BadDeny("10.0.0.0/99".into()))
    );
}

#[test]
fn the_host_loopback_and_metadata_are_never_reachable() {
    let own: Vec<IpAddr> = vec!["192.168.1.10".parse().unwrap()];
    for ip in [
        "127.0.0.1",
        "127.8.9.1",
        "::1",
        "169.254.169.254",
        "fe80::1",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "255.255.255.255",
        "192.168.1.10",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
        "fd00:ec2::254",
        "fd00:ec2::253",
        "::ffff:100.100.100.200",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::7f00:1",
    ] {
        assert!(never_reachable(ip.parse().unwrap(), &own), "{ip}");
    }
    for ip in [
        "10.0.0.5",
        "151.101.0.223",
        "2a04:4e42::223",
        "192.168.1.11",
    ] {
        assert!(!never_reachable(ip.parse().unwrap(), &own), "{ip}");
    }
}

/// A request the host refuses at once (a host name past DNS's limit).
fn refused_open(tunnel: u32) -> forkbox_protocol::AgentMsg {
    forkbox_protocol::AgentMsg::TunnelOpen {
        tunnel,
        host: "a".repeat(MAX_HOST_LEN + 1),
        port: 443,
    }
}

/// A guest that floods requests (eight queues' worth, each refused at once) while it reads
/// the replies slowly, as one under emulation on a busy host does: it is slowed down, every
/// refusal reaches it, and no violation is counted. (Every reply that found the queue full
/// counted as one, and the hostile suite's flood of tunnel opens cut off its guest so
/// when the suite's own load slowed that guest's agent down.)
#[tokio::test]
async fn a_flood_from_a_guest_that_reads_slowly_is_slowed_down_not_cut_off() {
    let (net, mut guest) = host_and_guest();
    let n = 8 * OUTBOX;
    let reader = tokio::spawn(async move {
        let mut dec = forkbox_protocol::FrameDecoder::new();
        let mut buf = vec![0u8; 4096];
        let mut refusals = 0;
        while refusals < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let k = guest.read(&mut buf).await.unwrap();
            assert!(
                k > 0,
                "the host closed the channel after {refusals} refusals"
            );
            dec.push(&buf[..k]);
            while let Some(f) = dec.next_frame().unwrap() {
                let msg = forkbox_protocol::decode::<HostMsg>(&f).unwrap();
                assert!(
                    matches!(msg, HostMsg::TunnelReady { error: Some(_), .. }),
                    "{msg:?}"
                );
                refusals += 1;
            }
        }
        refusals
    });
    for tunnel in 0..n as u32 {
        net.on_agent(refused_open(tunnel)).await.unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the guest was not sent every refusal within 60 s")
        .unwrap();
    assert_eq!(got, n);
    assert_eq!(net.violations.load(Ordering::Relaxed), 0);
}

/// A guest that floods requests and reads none of the replies is still cut off: once the
/// queue back is full, each reply that waits a whole stall for room is a violation, and
/// the one past [`MAX_VIOLATIONS`] ends the connection.
#[tokio::test]
async fn a_guest_that_floods_and_reads_no_replies_is_cut_off() {
    let (mut net, _guest) = host_and_guest();
    Arc::get_mut(&mut net).unwrap().read_stall = Duration::from_millis(50);
    let t = tokio::time::Instant::now();
    let mut sent = 0u32;
    let why = loop {
        match net.on_agent(refused_open(sent)).await {
            Ok(()) => sent += 1,
            Err(why) => break why,
        }
        assert!(sent < 100 * OUTBOX as u32, "never cut off");
    };
    assert!(why.contains("read none of the host's replies"), "{why}");
    assert_eq!(net.violations.load(Ordering::Relaxed), MAX_VIOLATIONS + 1);
    // Cut off after the stalls, not at the first full queue.
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(50) * (MAX_VIOLATIONS + 1),
        "{took:?}"
    );
    assert!(sent as usize >= OUTBOX, "cut off after {sent} requests");
}

/// Data on a tunnel the host does not know (closed for going past its window, say), far
/// more frames than the queue back holds, from a guest that reads nothing meanwhile:
/// told once that it is closed, no violation; a tunnel opened again under the number is
/// new.
#[tokio::test]
async fn a_closed_tunnel_is_reported_once_however_much_comes_on_it() {
    let (net, mut guest) = host_and_guest();
    for _ in 0..(3 * OUTBOX) {
        guest_sends(&net, 7, &[1; 100]).await;
    }
    assert_eq!(net.violations.load(Ordering::Relaxed), 0);
    let said = frames_for_guest(&mut guest, Duration::from_secs(1)).await;
    assert!(
        matches!(said.as_slice(), [HostMsg::TunnelClose { tunnel: 7 }]),
        "{said:?}"
    );
    // Opened again (refused here: no policy), then data on it: told again.
    let open = forkbox_protocol::AgentMsg::TunnelOpen {
        tunnel: 7,
        host: "example.org".into(),
        port: 443,
    };
    net.on_agent(open).await.unwrap();
    assert!(!lock(&net.told_closed).contains(&7));
}

/// A remote that resets its connection (after the guest spoke) ends the tunnel: the guest
/// is told once, and the tunnel no longer counts against [`MAX_TUNNELS`], whatever the
/// guest says after. (It was kept: the guest's end of data that followed never met an end
/// of the remote's, and an `npm ci` on a busy host, its registry resetting connections,
/// filled all 512.)
#[tokio::test]
async fn a_tunnel_whose_remote_resets_is_forgotten() {
    let (net, mut guest) = host_and_guest();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let remote = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    lock(&net.open).insert(9, Slot::Pending);
    let addr = listener.local_addr().unwrap();
    net.clone()
        .carry(9, addr, remote, Carry::Remote, None)
        .await;
    assert_eq!(net.tunnels(), 1);
    // The guest speaks, the server reads it and resets.
    guest_sends(&net, 9, b"ping").await;
    let mut server = server;
    server.read_exact(&mut [0u8; 4]).await.unwrap();
    server.set_zero_linger().unwrap();
    drop(server);
    let gone = async {
        while net.tunnels() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the tunnel is still counted 10 s after its remote reset it");
    // What the agent says once told (its program's end of data, then its close).
    net.on_agent(forkbox_protocol::AgentMsg::TunnelEof { tunnel: 9 })
        .await
        .unwrap();
    net.on_agent(forkbox_protocol::AgentMsg::TunnelClose { tunnel: 9 })
        .await
        .unwrap();
    assert_eq!(net.tunnels(), 0);
    assert_eq!(net.violations.load(Ordering::Relaxed), 0);
    let said = frames_for_guest(&mut guest, Duration::from_secs(1)).await;
    assert!(
        matches!(
            said.as_slice(),
            [
                HostMsg::TunnelReady {
                    tunnel: 9,
                    error: None
                },
                HostMsg::TunnelAck {
                    tunnel: 9,
                    bytes: 4
                },
                HostMsg::TunnelClose { tunnel: 9 }
            ]
        ),
        "{said:?}"
    );
}

/// A guest whose first bytes come seconds after the connect (a busy emulated guest), to a
/// server that resets a connection silent for a second (as the npm registry does after
/// 5-10 s): the bytes go over a new connection and the answer comes back; a server that
/// spoke first keeps its connection.
#[tokio::test]
async fn a_late_first_write_goes_over_a_fresh_connection() {
    let (net, mut guest) = host_and_guest();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The server: each connection gets a second to say something, or is reset.
    let server = tokio::spawn(async move {
        let mut served = 0;
        loop {
            let (mut c, _) = listener.accept().await.unwrap();
            served += 1;
            let mut b = [0u8; 5];
            match tokio::time::timeout(Duration::from_secs(1), c.read_exact(&mut b)).await {
                Ok(Ok(_)) => {
                    c.write_all(b"world").await.unwrap();
                    return (served, b);
                }
                _ => {
                    c.set_zero_linger().unwrap();
                    drop(c);
                }
            }
        }
    });
    let remote = tokio::net::TcpStream::connect(addr).await.unwrap();
    lock(&net.open).insert(3, Slot::Pending);
    net.clone()
        .carry(3, addr, remote, Carry::Remote, None)
        .await;
    tokio::time::sleep(FRESH_FOR + Duration::from_millis(500)).await;
    guest_sends(&net, 3, b"hello").await;
    let (served, got) = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((served, &got), (2, b"hello"));
    let said = frames_for_guest(&mut guest, Duration::from_secs(2)).await;
    let data: Vec<u8> = said
        .iter()
        .filter_map(|m| match m {
            HostMsg::TunnelData { tunnel: 3, data } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(data, b"world", "{said:?}");
    assert!(
        !said
            .iter()
            .any(|m| matches!(m, HostMsg::TunnelClose { .. })),
        "{said:?}"
    );
    assert_eq!(net.tunnels(), 1);

    // A server that speaks first: its connection stays, however late the guest answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut c, _) = listener.accept().await.unwrap();
        c.write_all(b"SSH-2.0-x\r\n").await.unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).await.unwrap();
        b
    });
    let remote = tokio::net::TcpStream::connect(addr).await.unwrap();
    lock(&net.open).insert(4, Slot::Pending);
    net.clone()
        .carry(4, addr, remote, Carry::Remote, None)
        .await;
    tokio::time::sleep(FRESH_FOR + Duration::from_millis(500)).await;
    guest_sends(&net, 4, b"reply").await;
    let got = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"reply");
}

#[tokio::test]
async fn names_that_resolve_to_the_host_are_refused() {
    let p = allow(&["localhost:8080", "127.0.0.1:8080"]);
    let e = resolve(&p, "localhost", 8080).await.unwrap_err();
    assert!(e.contains("may never reach"), "{e}");
    let e = resolve(&p, "127.0.0.1", 8080).await.unwrap_err();
    assert!(e.contains("may never reach"), "{e}");
}

/// A remote with lots to send on two tunnels: the guest takes nothing of the first (its
/// window full, no acknowledgement) and a little of the second every 200 ms. The first is
/// closed by the host after [`HostNet::read_nothing`], said in the sandbox's network log;
/// the slow reader keeps its tunnel and gets its data.
#[tokio::test]
async fn a_tunnel_whose_guest_reads_nothing_is_closed_in_words_and_a_slow_reader_is_not() {
    let (mut net, mut guest) = host_and_guest();
    Arc::get_mut(&mut net).unwrap().read_nothing = Duration::from_millis(800);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The remote: writes as much as each connection takes.
    tokio::spawn(async move {
        loop {
            let (mut c, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let chunk = vec![7u8; 64 * 1024];
                while c.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    for tunnel in [1, 2] {
        let remote = tokio::net::TcpStream::connect(addr).await.unwrap();
        lock(&net.open).insert(tunnel, Slot::Pending);
        net.clone()
            .carry(tunnel, addr, remote, Carry::Remote, None)
            .await;
    }
    // The guest's agent: acknowledges 16 KiB of tunnel 2 every 200 ms, nothing of tunnel 1.
    let acks = {
        let net = net.clone();
        tokio::spawn(async move {
            for _ in 0..15 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let ack = forkbox_protocol::AgentMsg::TunnelAck {
                    tunnel: 2,
                    bytes: 16 * 1024,
                };
                net.on_agent(ack).await.unwrap();
            }
        })
    };
    let said = frames_for_guest(&mut guest, Duration::from_secs(3)).await;
    acks.await.unwrap();
    let closed: Vec<u32> = said
        .iter()
        .filter_map(|m| match m {
            HostMsg::TunnelClose { tunnel } => Some(*tunnel),
            _ => None,
        })
        .collect();
    assert_eq!(closed, [1], "{:?}", closed);
    let slow: usize = said
        .iter()
        .filter_map(|m| match m {
            HostMsg::TunnelData { tunnel: 2, data } => Some(data.len()),
            _ => None,
        })
        .sum();
    assert!(
        slow > TUNNEL_WINDOW as usize,
        "the slow reader got only {slow} bytes"
    );
    assert_eq!(net.tunnels(), 1);
    let notes = net.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].text.contains("the guest read nothing of it"),
        "{notes:?}"
    );
    assert!(notes[0].text.contains(&addr.to_string()), "{notes:?}");
}

//! Pins the wire encoding of every message. If this fails, the encoding changed: bump
//! `PROTOCOL_VERSION`, update COMPATIBILITY.md, then update the expected bytes here.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use forkbox_protocol::*;

fn hex<T: serde::Serialize>(m: &T) -> String {
    encode_frame(m).unwrap()[4..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn protocol_version_is_pinned() {
    assert_eq!(PROTOCOL_VERSION, 7);
}

#[test]
fn host_messages_encoding_is_pinned() {
    let spec = ExecSpec {
        program: Program::Argv(vec!["ls".into(), "-l".into()]),
        cwd: Some("/w".into()),
        env: vec![("A".into(), "b".into())],
        timeout_ms: Some(1000),
        stdin: true,
        tty: None,
        user: None,
    };
    let got: Vec<String> = vec![
        hex(&HostMsg::Ping { id: 1 }),
        hex(&HostMsg::Exec { id: 2, spec }),
        hex(&HostMsg::Exec {
            id: 3,
            spec: ExecSpec {
                program: Program::Shell("true".into()),
                cwd: None,
                env: vec![],
                timeout_ms: None,
                stdin: false,
                tty: Some(WinSize { rows: 24, cols: 27 }),
                user: Some("app".into()),
            },
        }),
        hex(&HostMsg::Stdin {
            id: 2,
            data: vec![1, 2],
        }),
        hex(&HostMsg::StdinClose { id: 2 }),
        hex(&HostMsg::Signal { id: 2, signal: 15 }),
        hex(&HostMsg::WriteFile {
            id: 4,
            path: "/f".into(),
            mode: 0o644,
            append: false,
            data: vec![7],
            last: true,
        }),
        hex(&HostMsg::ReadFile {
            id: 5,
            path: "/f".into(),
        }),
        hex(&HostMsg::PutArchive {
            id: 6,
            dest: "/d".into(),
            data: vec![1],
            last: true,
        }),
        hex(&HostMsg::GetArchive {
            id: 7,
            path: "/d".into(),
        }),
        hex(&HostMsg::Refresh {
            id: 8,
            refresh: Refresh {
                entropy: vec![9, 9],
                unix_secs: 1,
                unix_nanos: 2,
                hostname: "h".into(),
                machine_id: "m".into(),
                max_procs: 3,
                grow_root_to: 4,
            },
        }),
        hex(&HostMsg::Resize {
            id: 2,
            size: WinSize { rows: 24, cols: 80 },
        }),
        hex(&HostMsg::ForwardOpen {
            tunnel: 1 << 31,
            port: 8000,
        }),
    ];
    let want = vec![
        "0001",
        "01020002026c73022d6c01022f77010141016201e807010000",
        "01030104747275650000000001181b0103617070",
        "0202020102",
        "0302",
        "04021e",
        "0504022f66a40300010701",
        "0605022f66",
        "0706022f64010101",
        "0807022f64",
        "090802090901020168016d0304",
        "10021850",
        "118080808008c03e",
    ];
    assert_eq!(got, want);
}

#[test]
fn agent_messages_encoding_is_pinned() {
    let got: Vec<String> = vec![
        hex(&AgentMsg::Pong { id: 1 }),
        hex(&AgentMsg::Started { id: 2, pid: 300 }),
        hex(&AgentMsg::Stdout {
            id: 2,
            data: vec![65],
        }),
        hex(&AgentMsg::Stderr {
            id: 2,
            data: vec![66],
        }),
        hex(&AgentMsg::Exited {
            id: 2,
            status: ExitStatus::Code(7),
            timed_out: false,
            duration_ms: 12,
        }),
        hex(&AgentMsg::Exited {
            id: 2,
            status: ExitStatus::Signal(9),
            timed_out: true,
            duration_ms: 1,
        }),
        hex(&AgentMsg::FileData {
            id: 5,
            data: vec![1],
        }),
        hex(&AgentMsg::Done { id: 5 }),
        hex(&AgentMsg::Error {
            id: 6,
            kind: ErrorKind::NotFound,
            message: "no".into(),
        }),
    ];
    let want = vec![
        "0001",
        "0102ac02",
        "02020141",
        "03020142",
        "0402000e000c",
        "040201120101",
        "05050101",
        "0605",
        "070600026e6f",
    ];
    assert_eq!(got, want);
}

#[test]
fn tunnel_messages_encoding_is_pinned() {
    let host: Vec<String> = vec![
        hex(&HostMsg::NetUp { id: 1, port: 3128 }),
        hex(&HostMsg::TunnelReady {
            tunnel: 2,
            error: None,
        }),
        hex(&HostMsg::TunnelReady {
            tunnel: 2,
            error: Some("no".into()),
        }),
        hex(&HostMsg::TunnelData {
            tunnel: 3,
            data: vec![7],
        }),
        hex(&HostMsg::TunnelEof { tunnel: 4 }),
        hex(&HostMsg::TunnelAck {
            tunnel: 5,
            bytes: 65536,
        }),
        hex(&HostMsg::TunnelClose { tunnel: 6 }),
    ];
    assert_eq!(
        host,
        [
            "0a01b818",
            "0b0200",
            "0b0201026e6f",
            "0c030107",
            "0d04",
            "0e05808004",
            "0f06"
        ]
    );
    let agent: Vec<String> = vec![
        hex(&AgentMsg::TunnelOpen {
            tunnel: 1,
            host: "h".into(),
            port: 443,
        }),
        hex(&AgentMsg::TunnelData {
            tunnel: 1,
            data: vec![9],
        }),
        hex(&AgentMsg::TunnelEof { tunnel: 1 }),
        hex(&AgentMsg::TunnelAck {
            tunnel: 1,
            bytes: 10,
        }),
        hex(&AgentMsg::TunnelClose { tunnel: 1 }),
        hex(&AgentMsg::ForwardReady {
            tunnel: 1 << 31,
            error: None,
        }),
    ];
    assert_eq!(
        agent,
        [
            "08010168bb03",
            "09010109",
            "0a01",
            "0b010a",
            "0c01",
            "0d808080800800"
        ]
    );
}

#[test]
fn hello_layout_is_pinned() {
    let f = Hello::ours(HelloInfo {
        software: "s".into(),
        kernel: "k".into(),
        uptime_ms: 3,
    })
    .to_frame()
    .unwrap();
    let h: String = f.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(h, "0d000000464b4258070000000173016b03");
}

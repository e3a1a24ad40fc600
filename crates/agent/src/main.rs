//! forkbox-agent: PID 1 of every forkbox guest.
//!
//! It boots the guest from the initramfs (mounts, kernel modules, switch to the sandbox's root
//! disk), then serves the host over a virtio-serial port with the protocol of
//! `forkbox-protocol`: commands with streamed output, exit codes and timeouts, and files.

mod archive;
mod boot;
mod exec;
mod files;
mod net;
mod refresh;
mod serve;
mod volumes;
mod watch;
mod xattrs;

fn main() {
    if std::process::id() != 1 {
        // Run by a guest process as a helper of the E2B front end's scripts: file metadata
        // (`/proc/1/exe xattrs …`, as root) and watches (a copy of the binary, as a user).
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        match args.get(1).and_then(|a| a.to_str()) {
            Some("xattrs") => std::process::exit(xattrs::main(&args[2..])),
            Some("watch") => std::process::exit(watch::main(&args[2..])),
            _ => {}
        }
        eprintln!("forkbox-agent: must run as PID 1 inside a forkbox guest");
        std::process::exit(2);
    }
    let started = std::time::Instant::now();
    let result = boot::boot();
    let port = match result {
        Ok(p) => p,
        Err(e) => {
            eprintln!("forkbox-agent: boot failed: {e}");
            boot::power_off();
        }
    };
    eprintln!(
        "forkbox-agent: ready on {} ({} ms since kernel start, {} ms in agent)",
        port.display(),
        boot::uptime_ms(),
        started.elapsed().as_millis()
    );
    serve::serve(&port);
}

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

fn main() {
    if std::process::id() != 1 {
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

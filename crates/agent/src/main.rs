//! forkbox-agent: PID 1 of every forkbox guest.
//!
//! It boots the guest from the initramfs (mounts, kernel modules, switch to the sandbox's root
//! disk), then serves the host over a virtio-serial port with the protocol of
//! `forkbox-protocol`: commands with streamed output, exit codes and timeouts, and files.

mod boot;
mod exec;
mod files;
mod serve;

fn main() {
    let started = boot::uptime_ms();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if std::process::id() != 1 {
        eprintln!("forkbox-agent: must run as PID 1 inside a forkbox guest");
        std::process::exit(2);
    }
    let result = boot::boot(&cmdline);
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
        boot::uptime_ms().saturating_sub(started)
    );
    serve::serve(&port);
}

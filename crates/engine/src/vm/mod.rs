//! QEMU `microvm` guests: the accelerator decision and the QEMU process.

mod accel;
pub mod confined;
pub mod cpu;
pub mod jail;
pub mod program;
mod qemu;
pub mod qmp;
mod socket_wait;

#[cfg(test)]
pub(crate) use accel::host_fingerprint;
pub use accel::{
    decide, host_decision, kvm_refused, probe, Accel, AccelChoice, AccelDecision, PROBE_DEADLINE,
};
pub use program::QEMU;
pub use qemu::{
    console_tail, create_overlay, host_tsc_khz, kernel_cmdline, qemu_args, ram_bytes, ram_tail_kib,
    slot_serial, Console, Memory, Start, Vm, VmConfig, VolumeDisk, CONSOLE_CAP, EVENTS_SOCKET,
    QMP_SOCKET, TCG_RAM_TAIL_KIB, VOLUME_SLOTS,
};

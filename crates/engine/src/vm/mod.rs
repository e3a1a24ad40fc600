//! QEMU `microvm` guests: the accelerator decision and the QEMU process.

mod accel;
mod qemu;

pub use accel::{decide, Accel, AccelChoice, AccelDecision};
pub use qemu::{console_tail, create_overlay, qemu_args, Vm, VmConfig, QEMU};

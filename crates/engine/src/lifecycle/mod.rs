//! What keeps sandboxes over time for the daemon: the warm pool, command logs that outlive a
//! request, the health check (`doctor`).

pub mod commands;
pub mod doctor;
pub mod pool;

//! E2B's wire surface, the pieces that hold for every call (`../shared` notes list the facts,
//! read from E2B's published SDKs; the SDKs are the judges): the Connect protocol's framing of
//! the in-sandbox services' streams ([`connect`]) and the error shapes both planes require
//! ([`errors`]). The control plane and the services themselves are front ends over the engine's
//! operations, to come; nothing here reaches a sandbox.

pub mod connect;
pub mod errors;

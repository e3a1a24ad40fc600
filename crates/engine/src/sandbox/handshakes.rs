//! A guest's new connections opened a few at a time: each waits for its turn until the ones
//! before it have made their first round trip (the TLS handshake, for the connections package
//! managers make).
//!
//! Why: a TLS server gives a client a bounded time to answer its first flight (the npm
//! registry's front here: about 10 s, then it closes the connection). `npm ci` opens a
//! connection for every package it fetches, a hundred at once, and under emulation one
//! handshake step costs the guest's single Node thread ~0.15 s: the hundredth connection's
//! answer came 13 s after the server's first flight, the server had closed it, and npm saw
//! `ECONNRESET` / "socket hang up" and retried (twice, then failed). Opened a few at a time,
//! each handshake is answered within a second or two and nothing is retried; the guest does the
//! same work, in an order the servers accept.
//!
//! A turn ends when the guest sends something after the remote's first bytes reached it (a
//! handshake's round trip, or a second request), when the tunnel ends, or after [`HOLD`] (a
//! connection that never makes a round trip delays others that long at most). A connection
//! waits [`WAIT`] at most for its turn (the guest's agent gives up on an open after 60 s).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// New connections of one guest making their first round trip at once.
pub const AT_ONCE: usize = 6;
/// Longest a connection holds its turn without making its first round trip.
pub const HOLD: Duration = Duration::from_secs(10);
/// Longest a connection waits for a turn before it goes ahead without one.
pub const WAIT: Duration = Duration::from_secs(40);

/// One connection's turn, from the moment it is given until its first round trip.
pub struct Turn {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// When the remote's first bytes were passed to the guest.
    answered: Mutex<Option<Instant>>,
    /// The guest has sent something since then: the round trip is made.
    done: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Turn {
    /// Waits for a turn among `turns` ([`WAIT`] at most: then a turn without a permit, which
    /// holds nobody up).
    pub async fn take(turns: &Arc<Semaphore>) -> Arc<Turn> {
        let permit = tokio::time::timeout(WAIT, turns.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok);
        let held = permit.is_some();
        let turn = Arc::new(Turn {
            permit: Mutex::new(permit),
            answered: Mutex::new(None),
            done: AtomicBool::new(false),
        });
        if held {
            let weak: Weak<Turn> = Arc::downgrade(&turn);
            tokio::spawn(async move {
                tokio::time::sleep(HOLD).await;
                if let Some(t) = weak.upgrade() {
                    t.release();
                }
            });
        }
        turn
    }

    fn release(&self) {
        lock(&self.permit).take();
    }

    /// The remote's bytes reach the guest.
    pub fn remote_spoke(&self) {
        lock(&self.answered).get_or_insert_with(Instant::now);
    }

    /// The guest sends bytes: after the remote's first, the round trip is made and the turn
    /// goes to the next connection.
    pub fn guest_spoke(&self) {
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        if lock(&self.answered).is_some() {
            self.done.store(true, Ordering::Relaxed);
            self.release();
        }
    }

    /// How long ago the remote's first bytes reached a guest that has not answered them yet
    /// (`None` once it has, or before they came).
    pub fn unanswered_for(&self) -> Option<Duration> {
        if self.done.load(Ordering::Relaxed) {
            return None;
        }
        lock(&self.answered).map(|t| t.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_turn_passes_on_after_a_round_trip_and_not_before() {
        let turns = Arc::new(Semaphore::new(1));
        let first = Turn::take(&turns).await;
        assert_eq!(turns.available_permits(), 0);
        first.guest_spoke(); // the ClientHello: no round trip yet
        assert_eq!(turns.available_permits(), 0);
        first.remote_spoke();
        assert!(first.unanswered_for().is_some());
        first.guest_spoke();
        assert_eq!(turns.available_permits(), 1, "the round trip is made");
        assert_eq!(first.unanswered_for(), None);
        let second = Turn::take(&turns).await;
        drop(second);
        assert_eq!(
            turns.available_permits(),
            1,
            "a tunnel that ends gives its turn back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_is_held_for_a_bounded_time_and_waited_for_a_bounded_time() {
        let turns = Arc::new(Semaphore::new(1));
        let silent = Turn::take(&turns).await;
        let started = tokio::time::Instant::now();
        let next = Turn::take(&turns).await;
        assert_eq!(
            started.elapsed().as_secs(),
            HOLD.as_secs(),
            "taken once the first's hold ran out"
        );
        drop(silent);
        let third = Turn::take(&turns).await;
        assert_eq!(
            started.elapsed().as_secs(),
            HOLD.as_secs() * 2,
            "the second holds its turn as long"
        );
        drop((next, third));
        // Every permit held by turns that never end: a newcomer goes ahead after WAIT.
        let held: Vec<_> = (0..1)
            .map(|_| turns.clone().try_acquire_owned().unwrap())
            .collect();
        let t0 = tokio::time::Instant::now();
        let _late = Turn::take(&turns).await;
        assert_eq!(t0.elapsed().as_secs(), WAIT.as_secs());
        drop(held);
    }
}

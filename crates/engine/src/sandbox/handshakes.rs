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
//!
//! How many turns there are follows how fast the guest answers ([`Turns`]): one fewer (down to
//! one) each time a guest took more than [`SLOW`] to answer a remote's first bytes (or let its
//! turn run out, or the remote give up, without answering them), one more (up to [`AT_ONCE`])
//! each time it answered within [`QUICK`]. A connection that ends, or whose remote never
//! speaks (a server waiting for the guest, a tarpit), says nothing of the guest's speed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// New connections of one guest making their first round trip at once.
pub const AT_ONCE: usize = 6;
/// Longest a connection holds its turn without making its first round trip.
pub const HOLD: Duration = Duration::from_secs(10);
/// Longest a connection waits for a turn before it goes ahead without one.
pub const WAIT: Duration = Duration::from_secs(40);
/// An answer slower than this takes a turn away.
pub const SLOW: Duration = Duration::from_secs(3);
/// An answer quicker than this gives a turn back.
pub const QUICK: Duration = Duration::from_secs(1);

/// The turns of one guest's connections: as many as its answers show it can keep up with.
pub struct Turns {
    permits: Arc<Semaphore>,
    /// Turns there are now (given out or free), between 1 and [`AT_ONCE`].
    size: AtomicUsize,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns::with(AT_ONCE)
    }
}

impl Turns {
    /// `n` turns to start with (1 to [`AT_ONCE`]).
    pub fn with(n: usize) -> Turns {
        let n = n.clamp(1, AT_ONCE);
        Turns {
            permits: Arc::new(Semaphore::new(n)),
            size: AtomicUsize::new(n),
        }
    }

    /// Turns there are now.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// A turn ends, with what it says of the guest's speed.
    fn give_back(&self, permit: OwnedSemaphorePermit, answer: Answer) {
        let slow = match answer {
            Answer::After(a) => a > SLOW,
            Answer::Never => true,
            Answer::Unknown => false,
        };
        if slow {
            let shrunk = self
                .size
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n > 1).then(|| n - 1)
                });
            if shrunk.is_ok() {
                permit.forget();
                return;
            }
        } else if matches!(answer, Answer::After(a) if a < QUICK)
            && self
                .size
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < AT_ONCE).then_some(n + 1)
                })
                .is_ok()
        {
            self.permits.add_permits(1);
        }
        drop(permit);
    }
}

/// What a turn that ends says of the guest.
enum Answer {
    /// It answered the remote's first bytes this long after they came.
    After(Duration),
    /// It had not answered them when its turn ran out or the remote gave up on it.
    Never,
    /// Nothing: the remote never spoke, or the connection ended otherwise.
    Unknown,
}

/// One connection's turn, from the moment it is given until its first round trip.
pub struct Turn {
    turns: Arc<Turns>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// When the remote's first bytes were passed to the guest.
    answered: Mutex<Option<Instant>>,
    /// The guest has sent something since then: the round trip is made.
    done: AtomicBool,
    /// The task that ends the turn after [`HOLD`]; stopped when the turn ends first, so a
    /// guest that opens and drops connections quickly leaves no sleeping tasks behind.
    watchdog: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Turn {
    /// Waits for a turn among `turns` ([`WAIT`] at most: then a turn without a permit, which
    /// holds nobody up).
    pub async fn take(turns: &Arc<Turns>) -> Arc<Turn> {
        let permit = tokio::time::timeout(WAIT, turns.permits.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok);
        let held = permit.is_some();
        let turn = Arc::new(Turn {
            turns: turns.clone(),
            permit: Mutex::new(permit),
            answered: Mutex::new(None),
            done: AtomicBool::new(false),
            watchdog: Mutex::new(None),
        });
        if held {
            let weak: Weak<Turn> = Arc::downgrade(&turn);
            let watchdog = tokio::spawn(async move {
                tokio::time::sleep(HOLD).await;
                if let Some(t) = weak.upgrade() {
                    t.release();
                }
            });
            *lock(&turn.watchdog) = Some(watchdog);
        }
        turn
    }

    /// Gives the turn back (once), saying how long the guest took to answer: the round trip
    /// made, or the turn run out (unanswered if the remote had spoken).
    fn release(&self) {
        if let Some(p) = lock(&self.permit).take() {
            let answered = *lock(&self.answered);
            let answer = match (self.done.load(Ordering::Relaxed), answered) {
                (true, Some(t)) => Answer::After(t.elapsed()),
                (false, Some(_)) => Answer::Never,
                _ => Answer::Unknown,
            };
            self.turns.give_back(p, answer);
        }
    }

    /// The remote gave up on the connection before the guest answered its first bytes: the
    /// guest counts as slow (if the turn is still held).
    pub fn cut_short(&self) {
        if let Some(p) = lock(&self.permit).take() {
            self.turns.give_back(p, Answer::Never);
        }
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
            if let Some(w) = lock(&self.watchdog).take() {
                w.abort();
            }
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

impl Drop for Turn {
    /// A tunnel that ends gives its turn back, saying nothing of the guest's speed (a plain
    /// HTTP answer read and closed, a refused or unused connection); a remote that gave up on
    /// an unanswered one said so first ([`Turn::cut_short`]).
    fn drop(&mut self) {
        if let Some(w) = lock(&self.watchdog).take() {
            w.abort();
        }
        if let Some(p) = lock(&self.permit).take() {
            self.turns.give_back(p, Answer::Unknown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(t: &Turns) -> usize {
        t.permits.available_permits()
    }

    #[tokio::test]
    async fn a_turn_passes_on_after_a_round_trip_and_not_before() {
        let turns = Arc::new(Turns::with(1));
        let first = Turn::take(&turns).await;
        assert_eq!(free(&turns), 0);
        first.guest_spoke(); // the ClientHello: no round trip yet
        assert_eq!(free(&turns), 0);
        first.remote_spoke();
        assert!(first.unanswered_for().is_some());
        first.guest_spoke();
        assert_eq!(first.unanswered_for(), None);
        assert_eq!(turns.size(), 2, "a quick answer gives a turn more");
        assert_eq!(free(&turns), 2);
        let second = Turn::take(&turns).await;
        drop(second);
        drop(first);
        tokio::task::yield_now().await;
        assert_eq!(
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
            0,
            "a turn that ends stops its watchdog: a guest opening and dropping connections \
             quickly leaves no sleeping tasks"
        );
        assert_eq!(
            free(&turns),
            2,
            "a tunnel that ends unused gives its turn back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_is_held_for_a_bounded_time_and_waited_for_a_bounded_time() {
        let turns = Arc::new(Turns::with(1));
        let silent = Turn::take(&turns).await;
        let started = tokio::time::Instant::now();
        let next = Turn::take(&turns).await;
        assert_eq!(
            started.elapsed(),
            HOLD,
            "taken once the first's hold ran out"
        );
        drop(silent);
        let third = Turn::take(&turns).await;
        assert_eq!(
            started.elapsed(),
            HOLD * 2,
            "the second holds its turn as long"
        );
        assert_eq!(turns.size(), 1, "never fewer than one");
        drop((next, third));
        // Every turn held (by whatever never gives it back): a newcomer goes ahead after WAIT.
        let full = Arc::new(Turns::with(1));
        let held = full.permits.clone().try_acquire_owned().unwrap();
        let t0 = tokio::time::Instant::now();
        let late = Turn::take(&full).await;
        assert_eq!(t0.elapsed(), WAIT);
        drop((held, late));
    }

    #[tokio::test(start_paused = true)]
    async fn slow_answers_take_turns_away_and_quick_ones_give_them_back() {
        let turns = Arc::new(Turns::default());
        let answer = |after: Duration| {
            let turns = turns.clone();
            async move {
                let t = Turn::take(&turns).await;
                t.remote_spoke();
                tokio::time::sleep(after).await;
                t.guest_spoke();
            }
        };
        for _ in 0..AT_ONCE + 2 {
            answer(SLOW + Duration::from_millis(500)).await;
        }
        assert_eq!(turns.size(), 1);
        assert_eq!(free(&turns), 1);
        for _ in 0..AT_ONCE + 2 {
            answer(Duration::from_millis(200)).await;
        }
        assert_eq!(turns.size(), AT_ONCE);
        assert_eq!(free(&turns), AT_ONCE);
        // A remote that gives up on an unanswered connection counts as slow too.
        let cut = Turn::take(&turns).await;
        cut.remote_spoke();
        cut.cut_short();
        assert_eq!(turns.size(), AT_ONCE - 1);
        drop(cut);
        // A connection that ends after the remote spoke (a plain HTTP answer read and closed),
        // and one whose remote never speaks until its turn runs out, say nothing.
        let read_and_closed = Turn::take(&turns).await;
        read_and_closed.remote_spoke();
        drop(read_and_closed);
        let tarpit = Turn::take(&turns).await;
        tokio::time::sleep(HOLD + Duration::from_secs(1)).await;
        drop(tarpit);
        assert_eq!(turns.size(), AT_ONCE - 1);
        assert_eq!(free(&turns), AT_ONCE - 1);
    }
}

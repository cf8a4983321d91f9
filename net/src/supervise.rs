//! Essential tasks: a process whose controller, sweeper or report loop has ended must not
//! stay up looking healthy while it does nothing. A task spawned here that ends before the
//! process is told to stop (it returned, or it panicked) cancels the process's stop token,
//! so everything winds down, readiness turns false and the binary exits non-zero with the
//! reason.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::error;

/// Spawns essential tasks and remembers the first that ended too early.
#[derive(Debug, Clone)]
pub struct Supervisor {
    stop: CancellationToken,
    failure: Arc<OnceLock<String>>,
}

/// An essential task: [`Essential::join`] waits for it, [`Essential::abort`] stops it
/// without counting that as a failure when the stop token was cancelled first.
#[derive(Debug)]
pub struct Essential {
    watcher: JoinHandle<()>,
    task: AbortHandle,
}

impl Essential {
    /// Waits until the task has ended (and its end was recorded).
    pub async fn join(self) {
        let _ = self.watcher.await;
    }

    /// Waits until the task has ended, keeping the handle (to abort it after a timeout).
    /// Call it once.
    pub async fn wait(&mut self) {
        let _ = (&mut self.watcher).await;
    }

    /// Stops the task at its next await point.
    pub fn abort(&self) {
        self.task.abort();
    }
}

impl Supervisor {
    /// A supervisor that cancels `stop` when an essential task ends early.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            stop,
            failure: Arc::new(OnceLock::new()),
        }
    }

    /// The token every essential task should stop on.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Spawns `task`, named `name` in the failure it causes by ending before `stop`.
    pub fn spawn<F>(&self, name: &'static str, task: F) -> Essential
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let inner = tokio::spawn(task);
        let abort = inner.abort_handle();
        let stop = self.stop.clone();
        let failure = self.failure.clone();
        let watcher = tokio::spawn(async move {
            let ended = inner.await;
            if stop.is_cancelled() {
                return;
            }
            let why = match ended {
                Ok(()) => format!("{name} stopped on its own"),
                Err(e) if e.is_panic() => {
                    let payload = e.into_panic();
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no message".to_owned());
                    format!("{name} panicked: {message}")
                }
                Err(_) => format!("{name} was cancelled"),
            };
            error!(task = name, reason = %why, "an essential task ended; the process stops");
            let _ = failure.set(why);
            stop.cancel();
        });
        Essential {
            watcher,
            task: abort,
        }
    }

    /// Why the process is stopping, when an essential task ended early.
    pub fn failure(&self) -> Option<String> {
        self.failure.get().cloned()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_task_that_returns_early_stops_the_process() {
        let supervisor = Supervisor::new(CancellationToken::new());
        let quits = supervisor.spawn("sweeper", async {});
        let stop = supervisor.stop().clone();
        let waits = supervisor.spawn("controller", async move { stop.cancelled().await });
        quits.join().await;
        waits.join().await;
        assert!(supervisor.stop().is_cancelled());
        assert_eq!(
            supervisor.failure().as_deref(),
            Some("sweeper stopped on its own")
        );
    }

    #[tokio::test]
    async fn a_panic_stops_the_process_with_its_message() {
        let supervisor = Supervisor::new(CancellationToken::new());
        let n = 7;
        supervisor
            .spawn("reconciler", async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                panic!("bad spec {n}");
            })
            .join()
            .await;
        assert!(supervisor.stop().is_cancelled());
        assert_eq!(
            supervisor.failure().as_deref(),
            Some("reconciler panicked: bad spec 7")
        );
    }

    #[tokio::test]
    async fn tasks_that_end_after_stop_or_are_aborted_after_it_are_no_failure() {
        let supervisor = Supervisor::new(CancellationToken::new());
        let stop = supervisor.stop().clone();
        let task = supervisor.spawn("controller", async move { stop.cancelled().await });
        let forever = supervisor.spawn("loop", std::future::pending());
        supervisor.stop().cancel();
        forever.abort();
        task.join().await;
        forever.join().await;
        assert_eq!(supervisor.failure(), None);
    }

    #[tokio::test]
    async fn an_abort_before_stop_is_a_failure() {
        let supervisor = Supervisor::new(CancellationToken::new());
        let forever = supervisor.spawn("loop", std::future::pending());
        forever.abort();
        forever.join().await;
        assert_eq!(supervisor.failure().as_deref(), Some("loop was cancelled"));
    }
}

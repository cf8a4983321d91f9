//! Runs a controller's reconciliations the way kube-runtime's `applier` does, except that a
//! request due now starts now.
//!
//! kube-runtime 5 passes every request, due now or later, through its scheduler: a tokio-util
//! `DelayQueue`, which rounds a deadline up to the next millisecond of its own clock and then
//! sleeps on tokio's timer, which rounds up again. A watch event therefore started its
//! reconciliation 2.1 ms later (the median of 200 on the development machine; the test
//! `a_trigger_starts_its_reconciliation_at_once` shows the wait under tokio's paused clock).
//! Those 2 ms were the whole gap by which the hub told its first member of a `/scale` change
//! later than the push baseline at 100 members (docs/scale.md, "Fifth round").
//!
//! What is kept from kube-runtime, and tested here: one reconciliation of an object at a
//! time, different objects at once; a request for an object being reconciled runs it again
//! after it (several coalesce into one); of two requests for an object the earlier wins;
//! nothing runs before the store has listed once; an object no longer in the store is not
//! reconciled; a failed reconciliation is retried as the error policy says; a shutdown
//! starts nothing new and waits for what runs. Requeues keep the millisecond `DelayQueue`.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{Instrument, debug, info_span, warn};

/// What a reconciliation asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `after`, unless a change comes first.
    pub const fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Reconcile again only when a change comes.
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// How long until the next reconciliation, if one is asked for.
    pub const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

type Running<K> = Pin<Box<dyn Future<Output = (ObjectRef<K>, Action)> + Send>>;

/// The requests of the objects that are not being reconciled, and of those that are.
struct Queue<K: Resource>
where
    K::DynamicType: Eq + Hash,
{
    /// Requests due later: the `DelayQueue` key and when.
    later: HashMap<ObjectRef<K>, (delay_queue::Key, Instant)>,
    timers: DelayQueue<ObjectRef<K>>,
    /// Objects being reconciled, each with the earliest request made meanwhile.
    running: HashMap<ObjectRef<K>, Option<Instant>>,
    /// Requests due before the store had listed once.
    held: Vec<ObjectRef<K>>,
}

impl<K: Resource> Queue<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn new() -> Self {
        Self {
            later: HashMap::new(),
            timers: DelayQueue::new(),
            running: HashMap::new(),
            held: Vec::new(),
        }
    }

    /// Records a request for `obj` at `at`; returns whether it is due now and the object
    /// free, so that the caller starts it.
    fn request(&mut self, obj: ObjectRef<K>, at: Instant, now: Instant) -> Option<ObjectRef<K>> {
        if let Some(pending) = self.running.get_mut(&obj) {
            *pending = Some(pending.map_or(at, |p| p.min(at)));
            return None;
        }
        if at <= now {
            if let Some((key, _)) = self.later.remove(&obj) {
                self.timers.remove(&key);
            }
            return Some(obj);
        }
        match self.later.get_mut(&obj) {
            Some((_, when)) if *when <= at => {}
            Some((key, when)) => {
                self.timers.reset_at(key, at);
                *when = at;
            }
            None => {
                let key = self.timers.insert_at(obj.clone(), at);
                self.later.insert(obj, (key, at));
            }
        }
        None
    }
}

/// Reconciles the objects `triggers` names, with the object from `store`, until `shutdown`
/// (or the end of `triggers`) and the reconciliations then running have finished.
pub async fn run<K, C, E, Fut>(
    store: Store<K>,
    triggers: impl Stream<Item = ObjectRef<K>> + Send,
    reconcile: impl Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync,
    error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action + Send + Sync + 'static,
    ctx: Arc<C>,
    shutdown: CancellationToken,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
    ObjectRef<K>: Display,
    C: Send + Sync + 'static,
    E: Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let error_policy = Arc::new(error_policy);
    let start = |obj: ObjectRef<K>, queue: &mut Queue<K>| -> Option<Running<K>> {
        let Some(object) = store.get(&obj) else {
            debug!(object = %obj, "not reconciled: no longer in the store");
            return None;
        };
        queue.running.insert(obj.clone(), None);
        let span = info_span!("reconciling object", object.ref = %obj);
        let reconciliation = reconcile(object.clone(), ctx.clone());
        let (error_policy, ctx) = (error_policy.clone(), ctx.clone());
        Some(Box::pin(
            async move {
                let action = match reconciliation.await {
                    Ok(action) => action,
                    Err(e) => error_policy(object, &e, ctx),
                };
                (obj, action)
            }
            .instrument(span),
        ))
    };

    let mut queue = Queue::<K>::new();
    let mut running: FuturesUnordered<Running<K>> = FuturesUnordered::new();
    let ready = store.wait_until_ready();
    tokio::pin!(ready);
    let mut is_ready = false;
    let mut stopping = false;
    tokio::pin!(triggers);
    loop {
        if stopping && running.is_empty() {
            return;
        }
        // A shutdown first; what finished before what is asked anew.
        let due = tokio::select! {
            biased;
            () = shutdown.cancelled(), if !stopping => {
                stopping = true;
                continue;
            }
            listed = &mut ready, if !is_ready => {
                if listed.is_err() {
                    warn!("the store's writer is gone before its first list: nothing to reconcile");
                    stopping = true;
                    continue;
                }
                is_ready = true;
                std::mem::take(&mut queue.held)
            }
            Some((obj, action)) = running.next(), if !running.is_empty() => {
                let now = Instant::now();
                let pending = queue.running.remove(&obj).flatten();
                // A requeue too far to be represented is none.
                let requeue = action.requeue_after.and_then(|d| now.checked_add(d));
                // One request, the earlier: two would start the object twice.
                match pending.into_iter().chain(requeue).min() {
                    Some(at) => queue.request(obj, at, now).into_iter().collect(),
                    None => Vec::new(),
                }
            }
            trigger = triggers.next(), if !stopping => {
                let Some(obj) = trigger else {
                    stopping = true;
                    continue;
                };
                let now = Instant::now();
                queue.request(obj, now, now).into_iter().collect()
            }
            Some(expired) = queue.timers.next(), if !stopping && !queue.later.is_empty() => {
                let obj = expired.into_inner();
                queue.later.remove(&obj);
                vec![obj]
            }
        };
        if stopping {
            continue;
        }
        // Each step makes an object due at most once, and only when it is not running
        // (`Queue::request`): nothing here starts an object twice.
        for obj in due {
            if !is_ready {
                if !queue.held.contains(&obj) {
                    queue.held.push(obj);
                }
            } else if let Some(r) = start(obj, &mut queue) {
                running.push(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher;
    use tokio::sync::mpsc;

    use super::*;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn obj(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    fn listed(writer: &mut Writer<ConfigMap>, names: &[&str]) {
        writer.apply_watcher_event(&watcher::Event::Init);
        for name in names {
            writer.apply_watcher_event(&watcher::Event::InitApply(cm(name)));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    /// What the test's reconciler saw and does: each reconciliation is recorded with the
    /// (paused) clock when it started and ended, takes `takes` and returns `next` (or fails
    /// when `fail` names the object); the first ones take and return what `plan` says.
    #[derive(Default)]
    struct Script {
        started: Mutex<Vec<(String, Instant)>>,
        finished: Mutex<Vec<(String, Instant, Action)>>,
        takes: Mutex<Duration>,
        next: Mutex<Option<Action>>,
        plan: Mutex<std::collections::VecDeque<(Duration, Action)>>,
        fail: Mutex<Option<String>>,
        errors: Mutex<Vec<String>>,
    }

    impl Script {
        fn started(&self) -> Vec<(String, Instant)> {
            self.started.lock().unwrap().clone()
        }
        fn names(&self) -> Vec<String> {
            self.started().into_iter().map(|(n, _)| n).collect()
        }
    }

    struct Harness {
        script: Arc<Script>,
        triggers: mpsc::UnboundedSender<ObjectRef<ConfigMap>>,
        writer: Writer<ConfigMap>,
        shutdown: CancellationToken,
        runner: tokio::task::JoinHandle<()>,
    }

    fn harness() -> Harness {
        let (store, writer) = reflector::store::<ConfigMap>();
        let (triggers, rx) = mpsc::unbounded_channel();
        let script = Arc::new(Script::default());
        let shutdown = CancellationToken::new();
        let runner = tokio::spawn(run(
            store,
            tokio_stream_of(rx),
            |object: Arc<ConfigMap>, script: Arc<Script>| async move {
                let name = object.metadata.name.clone().unwrap();
                script
                    .started
                    .lock()
                    .unwrap()
                    .push((name.clone(), Instant::now()));
                let planned = script.plan.lock().unwrap().pop_front();
                let (takes, next) = planned.unwrap_or_else(|| {
                    let next = script.next.lock().unwrap();
                    (
                        *script.takes.lock().unwrap(),
                        next.unwrap_or(Action::await_change()),
                    )
                });
                tokio::time::sleep(takes).await;
                script
                    .finished
                    .lock()
                    .unwrap()
                    .push((name.clone(), Instant::now(), next));
                if script.fail.lock().unwrap().as_deref() == Some(name.as_str()) {
                    return Err(format!("{name} failed"));
                }
                Ok(next)
            },
            |_, error: &String, script: Arc<Script>| {
                script.errors.lock().unwrap().push(error.clone());
                Action::requeue(Duration::from_secs(5))
            },
            script.clone(),
            shutdown.clone(),
        ));
        Harness {
            script,
            triggers,
            writer,
            shutdown,
            runner,
        }
    }

    fn tokio_stream_of<T: Send + 'static>(
        mut rx: mpsc::UnboundedReceiver<T>,
    ) -> impl Stream<Item = T> + Send {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    /// Lets the runner and its reconciliations run without moving the paused clock.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_starts_its_reconciliation_at_once() {
        let mut h = harness();
        listed(&mut h.writer, &["a"]);
        settle().await;
        // Between two milliseconds, as a watch event is (the paused clock moves by whole
        // milliseconds on its own).
        tokio::time::advance(Duration::from_micros(300)).await;
        let sent = Instant::now();
        h.triggers.send(obj("a")).unwrap();
        settle().await;
        // The paused clock moves only when every task waits for a timer: a request that
        // went through a timer (kube-runtime's scheduler rounds it up to the next
        // millisecond twice) would start 1–2 ms after it was made.
        assert_eq!(h.script.started(), vec![("a".to_owned(), sent)]);
    }

    /// Why this module exists: kube-runtime's scheduler, which its `Controller` passes every
    /// request through, holds a request due now for whole milliseconds. When a kube-runtime
    /// release stops doing so, this test fails, and the `Controller` can come back.
    #[tokio::test(start_paused = true)]
    async fn kube_runtimes_scheduler_holds_a_request_due_now() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut scheduled = std::pin::pin!(kube::runtime::scheduler(rx));
        // Away from the clock's start, as a running controller is, and between two of its
        // milliseconds, as a watch event is: the paused clock moves by whole milliseconds.
        tokio::time::sleep(Duration::from_secs(12)).await;
        tokio::time::advance(Duration::from_micros(300)).await;
        let sent = Instant::now();
        tx.unbounded_send(kube::runtime::scheduler::ScheduleRequest {
            message: "a",
            run_at: sent,
        })
        .unwrap();
        assert_eq!(scheduled.next().await, Some("a"));
        let held = Instant::now() - sent;
        assert!(held >= Duration::from_micros(700), "held {held:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_store_has_listed_and_what_was_asked_runs_then() {
        let mut h = harness();
        h.triggers.send(obj("a")).unwrap();
        h.triggers.send(obj("a")).unwrap();
        h.triggers.send(obj("b")).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(h.script.started().is_empty());
        listed(&mut h.writer, &["a", "b"]);
        settle().await;
        let mut names = h.script.names();
        names.sort();
        assert_eq!(names, ["a", "b"], "each once");
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_not_in_the_store_is_not_reconciled() {
        let mut h = harness();
        listed(&mut h.writer, &["a"]);
        h.triggers.send(obj("gone")).unwrap();
        h.triggers.send(obj("a")).unwrap();
        settle().await;
        assert_eq!(h.script.names(), ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn one_reconciliation_of_an_object_at_a_time_and_triggers_meanwhile_run_it_once_after() {
        let mut h = harness();
        listed(&mut h.writer, &["a", "b"]);
        *h.script.takes.lock().unwrap() = Duration::from_secs(2);
        h.triggers.send(obj("a")).unwrap();
        settle().await;
        for _ in 0..3 {
            h.triggers.send(obj("a")).unwrap();
        }
        h.triggers.send(obj("b")).unwrap();
        settle().await;
        // `b` runs beside `a`; `a` does not run twice at once.
        assert_eq!(h.script.names(), ["a", "b"]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let started = h.script.started();
        assert_eq!(h.script.names(), ["a", "b", "a"], "{started:?}");
        let first_end = h.script.finished.lock().unwrap()[0].1;
        assert_eq!(started[2].1, first_end, "again as soon as the first ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_runs_after_its_delay_and_an_earlier_trigger_replaces_it() {
        let mut h = harness();
        listed(&mut h.writer, &["a"]);
        *h.script.next.lock().unwrap() = Some(Action::requeue(Duration::from_secs(10)));
        let t0 = Instant::now();
        h.triggers.send(obj("a")).unwrap();
        tokio::time::sleep(Duration::from_secs(11)).await;
        let started = h.script.started();
        assert_eq!(started.len(), 2, "{started:?}");
        assert_eq!(started[1].1 - t0, Duration::from_secs(10));

        // A trigger 1 s after that run replaces its requeue; the run it starts asks for
        // nothing, so nothing runs at the 10 s mark.
        *h.script.next.lock().unwrap() = Some(Action::await_change());
        tokio::time::sleep(Duration::from_secs(1)).await;
        h.triggers.send(obj("a")).unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(h.script.started().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_goes_to_the_error_policy_whose_action_is_followed() {
        let mut h = harness();
        listed(&mut h.writer, &["a"]);
        *h.script.fail.lock().unwrap() = Some("a".into());
        let t0 = Instant::now();
        h.triggers.send(obj("a")).unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(*h.script.errors.lock().unwrap(), ["a failed", "a failed"]);
        let started = h.script.started();
        assert_eq!(
            started[1].1 - t0,
            Duration::from_secs(5),
            "the policy's 5 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_starts_nothing_new_and_waits_for_what_runs() {
        let mut h = harness();
        listed(&mut h.writer, &["a", "b"]);
        *h.script.takes.lock().unwrap() = Duration::from_secs(3);
        *h.script.next.lock().unwrap() = Some(Action::requeue(Duration::from_millis(1)));
        h.triggers.send(obj("a")).unwrap();
        settle().await;
        h.shutdown.cancel();
        h.triggers.send(obj("b")).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!h.runner.is_finished(), "waits for `a`");
        (&mut h.runner).await.unwrap();
        assert_eq!(h.script.names(), ["a"]);
        assert_eq!(h.script.finished.lock().unwrap().len(), 1);
    }

    /// One step of a generated run: wait `after_ms`, then trigger object `object` (3 is not
    /// in the store).
    #[derive(Debug, Clone)]
    struct Step {
        after_ms: u64,
        object: usize,
    }

    const NAMES: [&str; 4] = ["a", "b", "c", "gone"];

    use proptest::prelude::*;

    proptest! {
        /// Whatever the triggers, the reconciliations' lengths and their requeues: never two
        /// reconciliations of one object at once; every trigger is followed by a
        /// reconciliation of its object; one that finds its object idle starts it at once;
        /// a requeue is honoured by its due time; an object not in the store never runs.
        #[test]
        fn the_runner_keeps_its_rules_whatever_comes(
            steps in proptest::collection::vec(
                (0u64..40, 0usize..4).prop_map(|(after_ms, object)| Step { after_ms, object }),
                1..40,
            ),
            plan in proptest::collection::vec(
                (0u64..30, proptest::option::of(0u64..60)),
                0..40,
            ),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let (triggered, started, finished) = runtime.block_on(async {
                let mut h = harness();
                *h.script.plan.lock().unwrap() = plan
                    .iter()
                    .map(|&(takes, requeue)| {
                        let next = requeue.map_or(Action::await_change(), |ms| {
                            Action::requeue(Duration::from_millis(ms))
                        });
                        (Duration::from_millis(takes), next)
                    })
                    .collect();
                listed(&mut h.writer, &NAMES[..3]);
                settle().await;
                let mut triggered = Vec::new();
                for step in &steps {
                    tokio::time::sleep(Duration::from_millis(step.after_ms)).await;
                    triggered.push((NAMES[step.object].to_owned(), Instant::now()));
                    h.triggers.send(obj(NAMES[step.object])).unwrap();
                    settle().await;
                }
                // Long enough for every plan entry to have run out.
                tokio::time::sleep(Duration::from_secs(10)).await;
                h.shutdown.cancel();
                (&mut h.runner).await.unwrap();
                let started = h.script.started();
                let finished = h.script.finished.lock().unwrap().clone();
                (triggered, started, finished)
            });
            prop_assert_eq!(started.len(), finished.len());
            prop_assert!(started.iter().all(|(n, _)| n != "gone"));
            for name in &NAMES[..3] {
                let runs: Vec<(Instant, Instant, Action)> = started
                    .iter()
                    .filter(|(n, _)| n == name)
                    .map(|(_, at)| *at)
                    .zip(finished.iter().filter(|(n, ..)| n == name).map(|(_, end, a)| (*end, *a)))
                    .map(|(start, (end, action))| (start, end, action))
                    .collect();
                for pair in runs.windows(2) {
                    prop_assert!(pair[1].0 >= pair[0].1, "{name}: overlapping runs {pair:?}");
                }
                for (_, at) in triggered.iter().filter(|(n, _)| n == name) {
                    prop_assert!(
                        runs.iter().any(|(start, ..)| start >= at),
                        "{name}: the trigger at {at:?} was never served"
                    );
                    let busy = runs.iter().any(|(start, end, _)| start <= at && at <= end);
                    if !busy {
                        prop_assert!(
                            runs.iter().any(|(start, ..)| start == at),
                            "{name}: idle at {at:?} but not started then"
                        );
                    }
                }
                for (_, end, action) in &runs {
                    if let Some(after) = action.requeue_after() {
                        // The DelayQueue rounds a deadline up to its next millisecond.
                        let due = *end + after + Duration::from_millis(1);
                        prop_assert!(
                            runs.iter().any(|(start, ..)| start >= end && *start <= due),
                            "{name}: a requeue after {after:?} at {end:?} was not honoured"
                        );
                    }
                }
            }
        }
    }
}

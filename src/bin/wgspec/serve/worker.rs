//! The GPU worker: one thread that loads the engine and then runs one job at a time from the
//! bounded [`Queue`], streaming token events back to the HTTP handler that queued the job. When
//! the handler is gone (its client disconnected), the events cannot be delivered, the generation
//! stops at the next token and the worker takes the next job; a job whose client leaves while it
//! waits leaves the queue at once.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};
use wgspec::engine::{DraftKind, DraftSpec, Engine, Prompter, Request, TokenEvent};
use wgspec::generation::FinishReason;
use wgspec::gpu::Gpu;
use wgspec::model::LoadOptions;
use wgspec::openai::Reply;

use super::error::ApiError;
use super::metrics::{GenerationCounts, Metrics};

/// What `wgspec serve` loads.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// A .gguf file, a Hugging Face folder or a known model name.
    pub model: String,
    /// What to draft with ([`DraftSpec`]: none, the n-gram, a draft model, Medusa heads or an
    /// EAGLE head, alone or with the n-gram).
    pub draft: DraftSpec,
    /// KV cache positions (default: the engine's, min(model context, 4096)).
    pub context: Option<usize>,
    /// The GPU memory budget of the models, in bytes (`--max-memory-mb`).
    pub max_memory: Option<u64>,
}

impl ModelConfig {
    /// The draft a request without a `draft` field speculates with.
    pub fn default_draft(&self) -> DraftKind {
        self.draft.kind()
    }
}

/// What the HTTP side learns once the models are loaded.
pub struct Loaded {
    /// A copy of the target's tokenizer and chat template: handlers tokenize requests (and
    /// check them against the context) before they queue them, and serve `/tokenize` and
    /// `/detokenize`.
    pub prompter: Arc<Prompter>,
    /// KV cache positions: prompt + generated tokens of one request.
    pub context: usize,
}

/// One generation waiting in the queue: a request that fits the context.
pub struct Job {
    /// Its `max_tokens` is the one [`wgspec::openai::fit_context`] allowed.
    pub request: Request,
    /// The request's prompt, tokenized.
    pub prompt: Vec<u32>,
    pub events: mpsc::UnboundedSender<Event>,
}

/// What the worker tells the handler of a job, in this order: `Started`, `Token`s, then `Done`
/// or `Failed` (or only `Failed`, when the request cannot run).
pub enum Event {
    /// The request fits the context and runs.
    Started,
    Token(TokenEvent),
    Done(Box<Reply>),
    Failed(ApiError),
}

/// The jobs waiting for the GPU worker, oldest first, at most `capacity` of them. A job leaves
/// it when the worker takes it or when its [`Ticket`] is dropped (its client left), so a place
/// held by a client that is gone is free for the next request at once.
pub struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
    capacity: usize,
}

struct QueueState {
    /// (ticket number, job), in arrival order.
    jobs: VecDeque<(u64, Job)>,
    next: u64,
    /// The worker has ended (it failed to load, or its thread is gone): nothing will run.
    closed: bool,
}

/// Why [`Queue::push`] refused a job.
pub enum Refused {
    Full,
    Closed,
}

/// A job's place in the [`Queue`]: dropping it takes the job out if it still waits.
pub struct Ticket {
    queue: Arc<Queue>,
    number: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.queue.lock().jobs.retain(|(n, _)| *n != self.number);
    }
}

impl Queue {
    pub fn new(capacity: usize) -> Arc<Queue> {
        let state = QueueState { jobs: VecDeque::new(), next: 0, closed: false };
        Arc::new(Queue { state: Mutex::new(state), ready: Condvar::new(), capacity })
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves a valid queue.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, or refuses it when `capacity` jobs wait or the worker has ended.
    pub fn push(self: &Arc<Self>, job: Job) -> Result<Ticket, Refused> {
        let mut state = self.lock();
        if state.closed {
            return Err(Refused::Closed);
        }
        if state.jobs.len() >= self.capacity {
            return Err(Refused::Full);
        }
        let number = state.next;
        state.next += 1;
        state.jobs.push_back((number, job));
        self.ready.notify_one();
        Ok(Ticket { queue: self.clone(), number })
    }

    /// The oldest job, waiting for one.
    fn pop(&self) -> Job {
        let mut state = self.lock();
        loop {
            if let Some((_, job)) = state.jobs.pop_front() {
                return job;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Jobs waiting (not counting the one the worker runs).
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Most jobs that may wait.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Refuses every job from now on and drops the waiting ones (their handlers see the worker
    /// gone).
    fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.jobs.clear();
    }
}

/// Closes the queue when the worker thread ends, however it ends (a panic included).
struct CloseOnExit(Arc<Queue>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Loads the target (and the draft model, if any) with progress on stderr.
fn load_engine(cfg: &ModelConfig) -> wgspec::Result<Engine> {
    let gpu = Arc::new(pollster::block_on(Gpu::new())?);
    eprintln!("adapter: {}", gpu.describe());
    let opts = LoadOptions { context: cfg.context, max_memory: cfg.max_memory, ..Default::default() };
    crate::load::load_engine(&gpu, &cfg.model, &cfg.draft, &opts, false)
}

/// Starts the worker thread: it loads the models, reports through `loaded`, then runs the jobs
/// of `queue` for as long as the process lives.
pub fn spawn(
    cfg: ModelConfig,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    loaded: oneshot::Sender<wgspec::Result<Loaded>>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("wgspec-gpu".into()).spawn(move || {
        let _close = CloseOnExit(queue.clone());
        let mut engine = match load_engine(&cfg) {
            Ok(e) => e,
            Err(e) => {
                let _ = loaded.send(Err(e));
                return;
            }
        };
        let context = engine.target_info().context;
        let info = Loaded { prompter: engine.shared_prompter(), context };
        if loaded.send(Ok(info)).is_err() {
            return;
        }
        loop {
            let job = queue.pop();
            // Its client left between leaving the queue and now.
            if job.events.is_closed() {
                continue;
            }
            run_job(&mut engine, job, &metrics);
        }
    })?;
    Ok(())
}

/// Runs one job and counts its generation (a cancelled one too: its tokens were computed).
fn run_job(engine: &mut Engine, job: Job, metrics: &Metrics) {
    let Job { request, prompt, events } = job;
    if events.send(Event::Started).is_err() {
        return;
    }
    let result = pollster::block_on(
        engine.generate_from(prompt, &request, &mut |ev| events.send(Event::Token(ev.clone())).is_ok()),
    );
    match result {
        Ok(c) => {
            metrics.generation(&GenerationCounts {
                prompt_tokens: c.prompt_tokens.len(),
                generated_tokens: c.tokens.len(),
                drafted: c.stats.drafted,
                accepted: c.stats.accepted,
                tokens_per_target_forward: c.stats.tokens_per_target_forward,
                cancelled: c.finish_reason == FinishReason::Cancelled,
            });
            // Only a client that went away cancels: nobody is left to tell.
            if c.finish_reason == FinishReason::Cancelled {
                return;
            }
            let _ = events.send(Event::Done(Box::new(Reply::from(c))));
        }
        Err(e) => {
            metrics.failed_generation();
            let _ = events.send(Event::Failed(e.into()));
        }
    }
}

//! The thread each runtime's registry runs: commands from the sampler,
//! handled one at a time off the sampling path (reading a process's
//! layout takes milliseconds), and a way to wait until every command sent
//! so far is done.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a registry's thread does with its commands.
pub trait Handler: Send + 'static {
    type Command: Send + 'static;

    fn handle(&mut self, command: Self::Command);

    /// How often `idle` runs while no command comes (None: never).
    const IDLE: Option<Duration> = None;

    /// Work that waits for time rather than a command (retries).
    fn idle(&mut self) {}
}

enum Message<C> {
    Do(C),
    Flush(mpsc::Sender<()>),
}

/// A registry's thread; dropping it ends the thread once its queue is
/// empty.
pub struct Worker<C> {
    sender: Option<mpsc::Sender<Message<C>>>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Send + 'static> Worker<C> {
    /// Starts thread `name` running `handler`.
    pub fn spawn<H: Handler<Command = C>>(name: &str, mut handler: H) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<Message<C>>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                loop {
                    let message = match H::IDLE {
                        Some(every) => match receiver.recv_timeout(every) {
                            Ok(message) => Some(message),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => break,
                        },
                        None => match receiver.recv() {
                            Ok(message) => Some(message),
                            Err(_) => break,
                        },
                    };
                    match message {
                        Some(Message::Do(command)) => handler.handle(command),
                        Some(Message::Flush(done)) => {
                            let _ = done.send(());
                        }
                        None => {}
                    }
                    if H::IDLE.is_some() {
                        handler.idle();
                    }
                }
            })?;
        Ok(Worker {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Queues `command`; returns at once.
    pub fn send(&self, command: C) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(Message::Do(command));
        }
    }

    /// Waits until every command sent so far is done.
    pub fn flush(&self) {
        let (done, wait) = mpsc::channel();
        if let Some(sender) = &self.sender
            && sender.send(Message::Flush(done)).is_ok()
        {
            let _ = wait.recv();
        }
    }
}

impl<C> Drop for Worker<C> {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    struct Sum(Arc<Mutex<u32>>);

    impl Handler for Sum {
        type Command = u32;
        fn handle(&mut self, n: u32) {
            *self.0.lock().unwrap() += n;
        }
    }

    #[test]
    fn commands_are_done_when_flush_returns() {
        let total = Arc::new(Mutex::new(0));
        let worker = Worker::spawn("test", Sum(total.clone())).unwrap();
        for n in 1..=10 {
            worker.send(n);
        }
        worker.flush();
        assert_eq!(*total.lock().unwrap(), 55);
    }
}

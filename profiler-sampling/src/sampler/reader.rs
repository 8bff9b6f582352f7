//! The ring buffer's reader: a thread of its own that only copies records
//! out of the kernel's ring buffer into a bounded queue in user space.
//!
//! Why a thread: everything else the agent does with a sample (reading a
//! new process's maps, parsing a binary and loading its unwind table,
//! symbolizing a window) can take a while — the first look at a 200 MB Go
//! binary takes seconds — and the kernel drops samples when the ring
//! buffer is full. With this thread the ring buffer is emptied every
//! `READ_EVERY` whatever the rest is doing; a stall then costs queue
//! memory (bounded by `max_bytes`, oldest records dropped and counted
//! beyond it), not samples of every other process.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};

/// How often the ring buffer is emptied at the latest (the BPF program
/// wakes the reader early only when the buffer is a quarter full).
const READ_EVERY: Duration = Duration::from_millis(100);

/// Records copied out of the ring buffer in one go: one allocation per
/// batch, not per record (at thousands of records a second, allocating
/// and freeing each was a sixth of the agent's time).
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    /// Where each record ends in `bytes`.
    ends: Vec<usize>,
}

impl Batch {
    fn push(&mut self, record: &[u8]) {
        self.bytes.extend_from_slice(record);
        self.ends.push(self.bytes.len());
    }

    fn records(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.bytes[start..end])
    }
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<Batch>,
    bytes: usize,
    /// Records dropped because the queue was full.
    dropped: u64,
    /// The thread has drained the ring buffer one last time and ended.
    finished: bool,
}

impl Queue {
    /// Appends `batch`; over `max_bytes` the oldest batches go (the
    /// consumer is far behind, and the newest samples are worth the most
    /// to a live profile), their records counted.
    fn push(&mut self, batch: Batch, max_bytes: usize) {
        if !batch.ends.is_empty() {
            self.bytes += batch.bytes.len();
            self.batches.push_back(batch);
        }
        while self.bytes > max_bytes
            && let Some(oldest) = self.batches.pop_front()
        {
            self.bytes -= oldest.bytes.len();
            self.dropped += oldest.ends.len() as u64;
        }
    }

    fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    stop: AtomicBool,
    max_bytes: usize,
}

/// The consumer's end: records in the order the kernel produced them.
pub struct RecordReader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl RecordReader {
    /// Starts the thread that owns `ring`.
    pub fn spawn(ring: RingBuf<MapData>, max_bytes: usize) -> std::io::Result<RecordReader> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            max_bytes,
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ring-buffer".into())
            .spawn(move || read_loop(ring, &thread_shared))?;
        Ok(RecordReader {
            shared,
            thread: Some(thread),
        })
    }

    /// Waits up to `timeout` for records, then hands every queued one to
    /// `on_record`. Returns how many.
    pub fn drain(&self, timeout: Duration, mut on_record: impl FnMut(&[u8])) -> usize {
        let batches = {
            let mut queue = self.lock();
            let deadline = Instant::now() + timeout;
            while queue.is_empty() && !queue.finished {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                queue = self
                    .shared
                    .ready
                    .wait_timeout(queue, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            queue.bytes = 0;
            std::mem::take(&mut queue.batches)
        };
        let mut count = 0;
        for record in batches.iter().flat_map(Batch::records) {
            on_record(record);
            count += 1;
        }
        count
    }

    /// Asks the thread to empty the ring buffer one last time and end, and
    /// waits for it: after this, `drain` sees every record the kernel
    /// wrote before the call.
    pub fn finish(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for RecordReader {
    fn drop(&mut self) {
        self.finish();
    }
}

fn read_loop(mut ring: RingBuf<MapData>, shared: &Shared) {
    let fd = ring.as_raw_fd();
    loop {
        let stopping = shared.stop.load(Ordering::Relaxed);
        if !stopping {
            let mut pollfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; EINTR just ends the wait early.
            unsafe { libc::poll(&mut pollfd, 1, READ_EVERY.as_millis() as i32) };
        }
        let mut batch = Batch::default();
        while let Some(item) = ring.next() {
            batch.push(&item);
        }
        {
            let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.push(batch, shared.max_bytes);
            if stopping {
                queue.finished = true;
            }
        }
        shared.ready.notify_all();
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: &[(u8, usize)]) -> Batch {
        let mut batch = Batch::default();
        for &(tag, len) in records {
            batch.push(&vec![tag; len]);
        }
        batch
    }

    #[test]
    fn a_batch_gives_back_its_records() {
        let batch = batch(&[(1, 3), (2, 5), (3, 1)]);
        let records: Vec<&[u8]> = batch.records().collect();
        assert_eq!(records, [&[1u8; 3][..], &[2; 5], &[3]]);
        assert_eq!(Batch::default().records().count(), 0);
    }

    #[test]
    fn a_full_queue_drops_the_oldest_batches_and_counts_their_records() {
        let mut queue = Queue::default();
        queue.push(batch(&[(1, 200), (2, 200)]), 1000);
        queue.push(batch(&[(3, 400)]), 1000);
        assert_eq!((queue.batches.len(), queue.dropped), (2, 0));
        queue.push(batch(&[(4, 400)]), 1000);
        assert_eq!(queue.dropped, 2);
        assert_eq!(queue.bytes, 800);
        let tags: Vec<u8> = queue
            .batches
            .iter()
            .flat_map(Batch::records)
            .map(|r| r[0])
            .collect();
        assert_eq!(tags, [3, 4]);
        queue.push(Batch::default(), 1000);
        assert_eq!(queue.batches.len(), 2);
    }
}

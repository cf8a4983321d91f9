//! Standard output whose reader may go away. `kubectl kedge crds | head` closes the pipe after
//! ten lines; the command should then stop quietly and successfully, as `cat` does. Rust
//! ignores SIGPIPE, so the closed pipe arrives as an [`std::io::ErrorKind::BrokenPipe`] write
//! error, which reaches the binary wrapped in whatever error the command returns (an I/O
//! error, a serde_json one). [`PipeOutput`] remembers that the reader left, so the binary can
//! tell it from a real failure without inspecting every wrapping. Restoring the default
//! SIGPIPE action instead would also kill the process in the middle of other work (a
//! `mc setup-member` applying objects) with no chance to clean up.

use std::io::{ErrorKind, Result, Write};

/// A writer that remembers whether its reader closed the pipe.
#[derive(Debug)]
pub struct PipeOutput<W> {
    inner: W,
    reader_closed: bool,
}

impl<W: Write> PipeOutput<W> {
    /// Wraps `inner` (standard output).
    pub fn new(inner: W) -> Self {
        PipeOutput {
            inner,
            reader_closed: false,
        }
    }

    /// Whether a write or flush failed because the reader closed the pipe: the command's
    /// error, if any, is then only the consequence and not worth reporting.
    pub fn reader_closed(&self) -> bool {
        self.reader_closed
    }

    fn note<T>(&mut self, result: Result<T>) -> Result<T> {
        if matches!(&result, Err(e) if e.kind() == ErrorKind::BrokenPipe) {
            self.reader_closed = true;
        }
        result
    }
}

impl<W: Write> Write for PipeOutput<W> {
    fn write(&mut self, buf: &[u8]) -> Result<usize> {
        let result = self.inner.write(buf);
        self.note(result)
    }

    fn flush(&mut self) -> Result<()> {
        let result = self.inner.flush();
        self.note(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts `room` bytes, then fails every write with `kind`.
    struct Pipe {
        room: usize,
        kind: ErrorKind,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> Result<usize> {
            if self.room == 0 {
                return Err(self.kind.into());
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_is_remembered_and_other_failures_are_not() {
        let mut out = PipeOutput::new(Pipe {
            room: 4,
            kind: ErrorKind::BrokenPipe,
        });
        out.write_all(b"abc").unwrap();
        assert!(!out.reader_closed());
        let err = out.write_all(b"defg").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BrokenPipe);
        assert!(out.reader_closed());

        let mut full = PipeOutput::new(Pipe {
            room: 0,
            kind: ErrorKind::StorageFull,
        });
        assert!(full.write_all(b"x").is_err());
        assert!(!full.reader_closed());
    }

    #[test]
    fn an_error_wrapped_by_serde_json_still_counts() {
        let mut out = PipeOutput::new(Pipe {
            room: 2,
            kind: ErrorKind::BrokenPipe,
        });
        assert!(serde_json::to_writer(&mut out, &vec!["a"; 100]).is_err());
        assert!(out.reader_closed());
    }
}

//! A connection that gives up on a stalled peer: a read that waits longer
//! than `read_idle` (a client that says nothing, an idle keep-alive) or a
//! write that waits longer than `write_stall` (a client that never reads
//! its answers) fails with `TimedOut`, which ends the connection. Each
//! timer runs only while its side waits, so a slow but steady client is
//! not cut off.
#![forbid(unsafe_code)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Sleep, sleep};

/// `io` with a deadline on each wait.
pub struct Deadline<T> {
    io: T,
    read_idle: Duration,
    write_stall: Duration,
    reading: Option<Pin<Box<Sleep>>>,
    writing: Option<Pin<Box<Sleep>>>,
}

impl<T> Deadline<T> {
    pub fn new(io: T, read_idle: Duration, write_stall: Duration) -> Deadline<T> {
        Deadline {
            io,
            read_idle,
            write_stall,
            reading: None,
            writing: None,
        }
    }
}

/// What a wait on one side comes to: `Ready` clears its timer; `Pending`
/// starts it (the first time) and fails once it has run out.
fn bounded<R>(
    got: Poll<io::Result<R>>,
    timer: &mut Option<Pin<Box<Sleep>>>,
    limit: Duration,
    what: &str,
    cx: &mut Context<'_>,
) -> Poll<io::Result<R>> {
    match got {
        Poll::Ready(r) => {
            *timer = None;
            Poll::Ready(r)
        }
        Poll::Pending => {
            let t = timer.get_or_insert_with(|| Box::pin(sleep(limit)));
            if t.as_mut().poll(cx).is_ready() {
                *timer = None;
                let msg = format!("the client {what} for {limit:?}");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, msg)));
            }
            Poll::Pending
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Deadline<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.io).poll_read(cx, buf);
        bounded(got, &mut me.reading, me.read_idle, "sent nothing", cx)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Deadline<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.io).poll_write(cx, buf);
        bounded(got, &mut me.writing, me.write_stall, "read nothing", cx)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.io).poll_flush(cx);
        bounded(got, &mut me.writing, me.write_stall, "read nothing", cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.io).poll_shutdown(cx);
        bounded(got, &mut me.writing, me.write_stall, "read nothing", cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.io).poll_write_vectored(cx, bufs);
        bounded(got, &mut me.writing, me.write_stall, "read nothing", cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

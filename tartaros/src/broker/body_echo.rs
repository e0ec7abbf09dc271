//! The credential echoed in a response *body* (adversarial round 8). An
//! error page that quotes the rejected header, or a "request inspector"
//! endpoint (httpbin's `/headers`), hands the agent the very value the
//! broker injected; until this round only headers were checked. The body
//! now passes through [`Masked`], which overwrites every form of a secret
//! [`Needles`] knows with `*` of the same length, so `Content-Length`
//! stays right and the page stays readable.
//!
//! A scan of the bytes is only as good as the bytes are plain, so the
//! broker also (in `server.rs`, with the header lists in `rules.rs`):
//! asks the upstream for `identity` bodies and refuses a response whose
//! body is under a content or transfer coding (`gzip` of an echo hides it
//! from any scan), and drops the agent's `Range` / `If-Range`, which
//! would let it fetch an echoed credential in pieces, each too short to
//! be recognized.

use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use zeroize::Zeroizing;

use super::echo::MIN_SECRET_PART;
use super::echo_forms;

/// Every byte string whose presence in a body means a secret reached it,
/// lower case (matching ignores ASCII case, as hex tokens read the same
/// in either).
#[derive(Default)]
pub(super) struct Needles {
    list: Vec<Zeroizing<Vec<u8>>>,
    /// The most [`Self::held_back`] holds: one byte less than the longest
    /// needle, and at least [`MIN_HOLD`].
    hold: usize,
    /// No needle holds a newline (always so: see [`Self::held_back`]).
    newline_free: bool,
    /// Answers in which a needle was masked or a header dropped.
    echoes: AtomicUsize,
}

/// Answers with an echoed secret the broker passes on (masked) before it
/// refuses every further call of the run. Each masking answers a guess:
/// an upstream that echoes the agent's words (an error quoting a bad
/// parameter) masks them when they are a run of the credential, so an
/// agent that knows 11 bytes of it (`Bearer ghp_`, a key's public
/// prefix) tried a 12th until it was masked and slid on, a byte per
/// masking (adversarial round 9). Each masking tells at most a byte (a
/// character of a base64 form: 6 bits), so the agent learns at most this
/// many; an API that echoes credentials fails after as many answers.
pub(super) const MAX_ECHOES: usize = 3;

/// [`Needles::held_back`] holds at least this much of an open line, so
/// the amount held does not tell the length of a secret (of up to ~680
/// bytes, whose longest form, `\u00XX` escapes, is six times as long).
const MIN_HOLD: usize = 4096;

impl Needles {
    /// The forms of each of `secrets`: the whole value and each of its
    /// whitespace-separated parts of at least [`MIN_SECRET_PART`] bytes
    /// (the credential without its `Bearer ` scheme), and what a `Basic`
    /// value holds decoded (`echo_forms::basic_decoded`); each as is, in
    /// the reversible encodings of `echo_forms` (base64 at every
    /// alignment, hex, UTF-16, `\u00XX`: adversarial round 9), and, as
    /// is or in base64, with `/` JSON-escaped as `\/` (PHP's
    /// `json_encode`) and percent-encoded (a URL in the page); and every
    /// run of [`MIN_SECRET_PART`] bytes of the value and of a decoded
    /// password, so that no such run of them survives however the rest
    /// was encoded.
    pub(super) fn of<'a>(secrets: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut list: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for secret in secrets {
            let decoded = echo_forms::basic_decoded(secret);
            let parts = secret
                .split(u8::is_ascii_whitespace)
                .filter(|part| part.len() >= MIN_SECRET_PART);
            let whole_and_parts = std::iter::once(secret)
                .chain(parts)
                .chain(decoded.iter().map(|d| d.as_slice()));
            for needle in whole_and_parts.filter(|n| !n.is_empty()) {
                let base64 = echo_forms::base64_forms(needle);
                for text in std::iter::once(needle).chain(base64.iter().map(|f| f.as_slice())) {
                    list.extend(text_forms(text));
                }
                list.extend(echo_forms::bytewise_forms(needle));
            }
            // Every run of MIN_SECRET_PART bytes too: an encoding that
            // changes one character (an HTML template's `&#x3D;` for `=`)
            // breaks every whole form above, and the runs between its
            // escapes are most of the credential.
            // Of a decoded `Basic` pair, the password's runs only: the
            // user name is no secret, and an API names it in its answers.
            let password = (decoded.len() == 2).then(|| decoded[0].as_slice());
            for value in std::iter::once(secret).chain(password) {
                list.extend(
                    value
                        .windows(MIN_SECRET_PART)
                        .map(|run| Zeroizing::new(run.to_vec())),
                );
            }
        }
        list.retain(|needle| !needle.is_empty());
        for needle in &mut list {
            needle.make_ascii_lowercase();
        }
        list.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
        list.dedup_by(|a, b| a.as_slice() == b.as_slice());
        let longest = list.iter().map(|n| n.len()).max().unwrap_or(1);
        let newline_free = list.iter().all(|n| !n.contains(&b'\n'));
        Self {
            hold: (longest - 1).max(MIN_HOLD),
            newline_free,
            list,
            echoes: AtomicUsize::new(0),
        }
    }

    /// Whether `text` holds any needle (a response header, which is
    /// dropped rather than masked).
    pub(super) fn found_in(&self, text: &[u8]) -> bool {
        let lower = text.to_ascii_lowercase();
        self.list
            .iter()
            .any(|needle| find(&lower, needle, needle[0]).is_some())
    }

    /// Overwrites every occurrence of a needle in `text` with `*`, as
    /// [`Masked`] does to a body (for the tests of the forms).
    #[cfg(test)]
    fn mask(&self, text: &mut [u8]) {
        for found in self.matches(text) {
            text[found].fill(b'*');
        }
    }

    /// Where the needles occur in `text`, found on its bytes as they are
    /// (masking one occurrence first would hide another that overlaps
    /// it).
    fn matches(&self, text: &[u8]) -> Vec<Range<usize>> {
        let mut found = Vec::new();
        if self.list.is_empty() {
            return found;
        }
        let lower = text.to_ascii_lowercase();
        for needle in &self.list {
            let first = needle[0];
            let mut from = 0;
            while let Some(at) = find(&lower[from..], needle, first) {
                let at = from + at;
                found.push(at..at + needle.len());
                from = at + 1;
            }
        }
        found
    }
}

impl Needles {
    /// Counts an answer in which a secret was masked or dropped.
    pub(super) fn note_echo(&self) {
        self.echoes.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the broker may still pass on answers: fewer than
    /// [`MAX_ECHOES`] held an echoed secret.
    pub(super) fn echoes_left(&self) -> bool {
        self.echoes.load(Ordering::Relaxed) < MAX_ECHOES
    }

    /// How many bytes at the end of `text` to hold back until the next
    /// chunk: the line it ends in (after its last `\n`), at most
    /// `hold` bytes. A needle has no newline (secrets have no control
    /// characters, and no form adds one) and is at most `hold + 1` bytes
    /// long, so one that starts before these ends within `text` and is
    /// masked. What is held depends only on where the chunk's lines end,
    /// never on the secrets: round 8 held back the end that could begin
    /// a needle, so an upstream that streamed the agent's own words back
    /// and paused showed it, by what arrived first, whether its words
    /// began the credential, a character at a time (adversarial round
    /// 9). Server-sent events and JSON lines end their chunks with a
    /// newline, so they still flow as they come.
    fn held_back(&self, text: &[u8]) -> usize {
        if self.list.is_empty() {
            return 0;
        }
        let tail = &text[text.len() - self.hold.min(text.len())..];
        if !self.newline_free {
            return tail.len();
        }
        match tail.iter().rposition(|&b| b == b'\n') {
            Some(at) => tail.len() - at - 1,
            None => tail.len(),
        }
    }
}

/// `text` as is, with `/` JSON-escaped as `\/`, and percent-encoded,
/// each built in wiped memory, as the secrets themselves are.
fn text_forms(text: &[u8]) -> [Zeroizing<Vec<u8>>; 3] {
    let mut slashed = Zeroizing::new(Vec::with_capacity(text.len() * 2));
    let mut encoded = Zeroizing::new(Vec::with_capacity(text.len() * 3));
    for &b in text {
        if b == b'/' {
            slashed.push(b'\\');
        }
        slashed.push(b);
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(b);
        } else {
            let hex = b"0123456789abcdef";
            encoded.extend([b'%', hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]);
        }
    }
    [Zeroizing::new(text.to_vec()), slashed, encoded]
}

/// The first position of `needle` (whose first byte is `first`) in `hay`.
fn find(hay: &[u8], needle: &[u8], first: u8) -> Option<usize> {
    let mut from = 0;
    while from + needle.len() <= hay.len() {
        let at = from + hay[from..].iter().position(|&b| b == first)?;
        if hay.get(at..at + needle.len()) == Some(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// A response body with every secret form masked. It holds back the open
/// line at the end of what it has seen ([`Needles::held_back`]), so a
/// secret split over two chunks is still found whole before any of it is
/// passed on.
pub(super) struct Masked<B> {
    inner: B,
    needles: Arc<Needles>,
    /// Seen and not yet passed on, as the upstream sent it (unmasked, so
    /// that a needle reaching into it is still found whole).
    held: BytesMut,
    /// How many bytes at the start of `held` belong to an occurrence
    /// found before and must be masked when they go.
    mask_through: usize,
    /// This answer has been counted as one that held a secret.
    noted: bool,
    /// The inner body has ended; what is held goes out, then `last`.
    ended: bool,
    /// A trailers frame that came after the data.
    last: Option<Frame<Bytes>>,
}

impl<B> Masked<B> {
    pub(super) fn new(inner: B, needles: Arc<Needles>) -> Self {
        Self {
            inner,
            needles,
            held: BytesMut::new(),
            mask_through: 0,
            noted: false,
            ended: false,
            last: None,
        }
    }

    /// The held bytes that may go now (all of them at the end of the
    /// body), masked; `None` when none may.
    fn release(&mut self) -> Option<Bytes> {
        let cut = if self.ended {
            self.held.len()
        } else {
            self.held.len() - self.needles.held_back(&self.held)
        };
        if cut == 0 {
            return None;
        }
        let found = self.needles.matches(&self.held);
        if !self.noted && (self.mask_through > 0 || found.iter().any(|r| r.start < cut)) {
            self.noted = true;
            self.needles.note_echo();
        }
        let mut out = self.held.split_to(cut);
        let mut carry = self.mask_through.saturating_sub(cut);
        out[..self.mask_through.min(cut)].fill(b'*');
        // An occurrence starting after the cut is found again next time;
        // one reaching across it is masked on both sides.
        for range in found.into_iter().filter(|r| r.start < cut) {
            out[range.start..range.end.min(cut)].fill(b'*');
            carry = carry.max(range.end.saturating_sub(cut));
        }
        self.mask_through = carry;
        Some(out.freeze())
    }
}

impl<B> Body for Masked<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                if let Some(rest) = this.release() {
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                return Poll::Ready(this.last.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.held.extend_from_slice(&data);
                        if let Some(out) = this.release() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(other) => {
                        this.ended = true;
                        this.last = Some(other);
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.last.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // Masking keeps the length.
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::collections::VecDeque;
    use std::convert::Infallible;

    const VALUE: &[u8] = b"Bearer ghp_Up5treamCred/9f8e+7d==";

    fn needles() -> Arc<Needles> {
        Arc::new(Needles::of([VALUE].into_iter()))
    }

    /// A body of the given chunks, one frame each.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
        }
    }

    #[test]
    fn every_form_is_masked_to_the_same_length() {
        let needles = needles();
        for page in [
            &b"{\"auth\": \"Bearer ghp_Up5treamCred/9f8e+7d==\"}"[..],
            b"bad token GHP_UP5TREAMCRED/9F8E+7D== given",
            b"{\"auth\": \"ghp_Up5treamCred\\/9f8e+7d==\"}",
            b"<a href=\"/cb?t=ghp_Up5treamCred%2F9f8e%2B7d%3D%3D\">",
        ] {
            let mut text = page.to_vec();
            needles.mask(&mut text);
            assert_eq!(text.len(), page.len());
            let lower = text.to_ascii_lowercase();
            assert!(
                find(&lower, b"ghp_up5treamcred", b'g').is_none(),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
        // Fewer than 12 bytes of it in a row are left alone.
        let mut plain = b"Bearer realm=\"api\" ghp_Up5tr".to_vec();
        needles.mask(&mut plain);
        assert_eq!(plain, b"Bearer realm=\"api\" ghp_Up5tr");
        // Twelve are masked, however the rest was encoded.
        let mut run = b"token ghp_Up5treamCred&#x2F;9f8e".to_vec();
        needles.mask(&mut run);
        // The space before it is a byte of the value too.
        assert_eq!(run, b"token*****************&#x2F;9f8e");
    }

    #[test]
    fn a_basic_users_name_alone_is_not_a_secret() {
        use base64::Engine;
        let pair = b"github-actions-deploy:s3cret-Passw0rd-77";
        let value = [
            &b"Basic "[..],
            base64::engine::general_purpose::STANDARD
                .encode(pair)
                .as_bytes(),
        ]
        .concat();
        let needles = Needles::of([value.as_slice()].into_iter());
        let mut page = b"{\"login\": \"github-actions-deploy\"}".to_vec();
        let before = page.clone();
        needles.mask(&mut page);
        assert_eq!(page, before);
        let mut page = b"{\"password\": \"s3cret-Passw0rd-77\"}".to_vec();
        needles.mask(&mut page);
        assert!(!page.windows(6).any(|w| w == b"s3cret"), "{page:?}");
    }

    #[tokio::test]
    async fn a_chunk_that_cannot_begin_a_secret_is_passed_on_whole() {
        let chunks = Chunks(VecDeque::from([Bytes::from_static(b"data: token 42\n\n")]));
        let mut body = Masked::new(chunks, needles());
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), &b"data: token 42\n\n"[..]);
        // An open line waits for the next chunk, whether or not it could
        // begin a secret.
        for open in [&b"x: Bearer gh"[..], b"x: zzz"] {
            let chunk = [&b"a: 1\n"[..], open].concat();
            let chunks = Chunks(VecDeque::from([
                Bytes::from(chunk),
                Bytes::from_static(b"p\n"),
            ]));
            let mut body = Masked::new(chunks, needles());
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), &b"a: 1\n"[..]);
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), [open, b"p\n"].concat());
        }
    }

    #[tokio::test]
    async fn a_secret_split_over_chunks_is_masked() {
        let page = b"x: Bearer ghp_Up5treamCred/9f8e+7d== y";
        let masked = format!("x: {} y", "*".repeat(VALUE.len()));
        let masked = masked.as_bytes();
        for cut in 1..page.len() {
            let chunks = Chunks(VecDeque::from([
                Bytes::copy_from_slice(&page[..cut]),
                Bytes::copy_from_slice(&page[cut..]),
            ]));
            let out = Masked::new(chunks, needles())
                .collect()
                .await
                .unwrap()
                .to_bytes();
            assert_eq!(&out[..], masked, "cut {cut}");
        }
    }
}

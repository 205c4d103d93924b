// mmfeed's batch entry points, compiled into libtokenizers.a next to the daulet/tokenizers
// C API (scripts/build-tokenizers.sh appends `mod mmfeed_batch;` to its lib.rs).
//
// One cgo call per batch: the texts arrive as one UTF-8 buffer plus n+1 offsets, results
// go into caller-owned buffers, nothing is allocated for the caller to free. Neither entry
// point builds what the Go side does not use (token strings, offsets, masks, type ids).
//
// The count is exactly len(ids) of an encode with the same settings: the same added-token
// extraction, normalizer, pre-tokenizer and model, then the truncation and the
// post-processor's added tokens applied as numbers (tokenize/count_test.go checks it on
// every bundled tokenizer). Counts (and, for BERT-style pipelines, chunk ids) are cached in
// a caller-owned cache that lives as long as the tokenizer (one per concurrent caller):
//   - per pre-token, for the models whose tokenize() is a pure function of the word
//     (WordPiece, WordLevel, Unigram; BPE has its own cache);
//   - per space-separated chunk of the raw text, for BERT-style pipelines (BertNormalizer
//     or none, BertPreTokenizer, no added token containing whitespace): there every
//     normalization step acts on single characters and keeps ' ', and the pre-tokenizer
//     splits at ' ' and drops it, so a text's tokens are its chunks' tokens in order.
use std::collections::HashMap;

use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::tokenizer::{Encoding, Model, OffsetReferential, OffsetType, PostProcessor, Token, Tokenizer};

use crate::UnifiedTokenizer;

/// Marks a text whose encode failed.
const FAILED: u32 = u32::MAX;

unsafe fn texts<'a>(buf: *const u8, offsets: *const u32, n: usize) -> Option<(&'a [u8], &'a [u32])> {
    if offsets.is_null() || (buf.is_null() && n > 0) {
        return None;
    }
    let offs = std::slice::from_raw_parts(offsets, n + 1);
    let total = offs[n] as usize;
    let bytes = if total == 0 { &[][..] } else { std::slice::from_raw_parts(buf, total) };
    Some((bytes, offs))
}

fn text_at<'a>(bytes: &'a [u8], offs: &[u32], i: usize) -> Option<std::borrow::Cow<'a, str>> {
    let (a, b) = (offs[i] as usize, offs[i + 1] as usize);
    if a > b || b > bytes.len() {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes[a..b]))
}

/// Encodes texts[start..n] into out_ids (capacity cap), writing each text's id count to
/// out_lens[i] (FAILED when the encode failed). Stops before a text whose ids do not fit
/// and returns its index (its out_lens[i] is then the count it needs); returns n when all
/// are done, or -1 for a bad argument.
/// cache is one made by mmfeed_count_cache_new for this tokenizer.
#[no_mangle]
pub extern "C" fn mmfeed_encode_batch(
    ptr: *mut libc::c_void, cache: *mut libc::c_void, buf: *const u8, offsets: *const u32, n: u32, start: u32,
    add_special_tokens: bool, out_ids: *mut u32, cap: usize, out_lens: *mut u32,
) -> i64 {
    let tk = match unsafe { ptr.cast::<UnifiedTokenizer>().as_ref() } {
        Some(t) => t,
        None => return -1,
    };
    let caches = match unsafe { cache.cast::<Caches>().as_mut() } {
        Some(c) => c,
        None => return -1,
    };
    let (n, start) = (n as usize, start as usize);
    let (bytes, offs) = match unsafe { texts(buf, offsets, n) } {
        Some(t) => t,
        None => return -1,
    };
    if out_lens.is_null() || (out_ids.is_null() && cap > 0) || start > n {
        return -1;
    }
    let lens = unsafe { std::slice::from_raw_parts_mut(out_lens, n) };
    let ids_out: &mut [u32] = if cap == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(out_ids, cap) } };
    let mut used = 0usize;
    for i in start..n {
        let ids = text_at(bytes, offs, i).and_then(|s| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode_ids(tk, &s, add_special_tokens, caches)))
                .ok()
                .flatten()
        });
        match ids {
            None => lens[i] = FAILED,
            Some(ids) => {
                lens[i] = ids.len() as u32;
                if used + ids.len() > cap {
                    return i as i64;
                }
                ids_out[used..used + ids.len()].copy_from_slice(&ids);
                used += ids.len();
            }
        }
    }
    n as i64
}

fn encode_ids(tk: &UnifiedTokenizer, text: &str, add_special_tokens: bool, caches: &mut Caches) -> Option<Vec<u32>> {
    let t: &Tokenizer = match tk {
        UnifiedTokenizer::HuggingFace(t) if caches.chunked => t,
        UnifiedTokenizer::HuggingFace(t) => return t.encode_fast(text, add_special_tokens).ok().map(|e| e.get_ids().to_vec()),
        other => return other.encode(text, add_special_tokens).ok(),
    };
    // BERT-style: the text's ids are its chunks' ids in order (see the top of this file);
    // truncation and special tokens are then the library's own post_process.
    let added = if add_special_tokens { t.get_post_processor().map_or(0, |p| p.added_tokens(false)) } else { 0 };
    let limit = t.get_truncation().map(|tr| tr.max_length.wrapping_sub(added));
    let mut ids: Vec<u32> = Vec::new();
    for chunk in text.split(' ').filter(|c| !c.is_empty()) {
        match caches.chunk_ids.get(chunk) {
            Some(c) => ids.extend_from_slice(c),
            None => {
                let c = chunk_ids(t, chunk)?;
                ids.extend_from_slice(&c);
                if caches.chunk_ids.len() < CACHE_MAX {
                    caches.chunk_ids.insert(chunk.to_owned(), c);
                }
            }
        }
        if limit.is_some_and(|l| ids.len() >= l) {
            break;
        }
    }
    let tokens = ids.into_iter().map(|id| Token::new(id, String::new(), (0, 0))).collect();
    let enc = t.post_process(Encoding::from_tokens(tokens, 0), None, add_special_tokens).ok()?;
    Some(enc.get_ids().to_vec())
}

/// The model's ids for one chunk, before truncation and special tokens.
fn chunk_ids(t: &Tokenizer, text: &str) -> Option<Vec<u32>> {
    let mut pre = t.get_added_vocabulary().extract_and_normalize(t.get_normalizer(), text);
    if let Some(p) = t.get_pre_tokenizer() {
        tokenizers::tokenizer::PreTokenizer::pre_tokenize(p, &mut pre).ok()?;
    }
    let mut ids = Vec::new();
    for (s, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
        match tokens {
            Some(toks) => ids.extend(toks.iter().map(|k| k.id)),
            None => ids.extend(t.get_model().tokenize(s).ok()?.iter().map(|k| k.id)),
        }
    }
    Some(ids)
}

/// Creates a count cache for one tokenizer, to pass to mmfeed_count_batch; the caller uses
/// it from one thread at a time and frees it with mmfeed_count_cache_free.
#[no_mangle]
pub extern "C" fn mmfeed_count_cache_new(ptr: *mut libc::c_void) -> *mut libc::c_void {
    let tk = match unsafe { ptr.cast::<UnifiedTokenizer>().as_ref() } {
        Some(t) => t,
        None => return std::ptr::null_mut(),
    };
    let c = Box::new(Caches { chunked: chunkable(tk), ..Default::default() });
    Box::into_raw(c).cast()
}

#[no_mangle]
pub extern "C" fn mmfeed_count_cache_free(cache: *mut libc::c_void) {
    if !cache.is_null() {
        drop(unsafe { Box::from_raw(cache.cast::<Caches>()) });
    }
}

/// Writes each text's id count (what mmfeed_encode_batch would return as its length) to
/// out_counts[i], FAILED when the encode fails, using and filling cache (made by
/// mmfeed_count_cache_new for this tokenizer). Returns 0, or -1 for a bad argument.
#[no_mangle]
pub extern "C" fn mmfeed_count_batch(
    ptr: *mut libc::c_void, cache: *mut libc::c_void, buf: *const u8, offsets: *const u32, n: u32,
    add_special_tokens: bool, out_counts: *mut u32,
) -> i32 {
    let tk = match unsafe { ptr.cast::<UnifiedTokenizer>().as_ref() } {
        Some(t) => t,
        None => return -1,
    };
    let caches = match unsafe { cache.cast::<Caches>().as_mut() } {
        Some(c) => c,
        None => return -1,
    };
    let n = n as usize;
    let (bytes, offs) = match unsafe { texts(buf, offsets, n) } {
        Some(t) => t,
        None => return -1,
    };
    if out_counts.is_null() {
        return -1;
    }
    let counts = unsafe { std::slice::from_raw_parts_mut(out_counts, n) };
    for i in 0..n {
        let c = text_at(bytes, offs, i).and_then(|s| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| count(tk, &s, add_special_tokens, caches)))
                .ok()
                .flatten()
        });
        counts[i] = c.unwrap_or(FAILED);
    }
    0
}

/// Bounds each of a cache's three maps (entries; a full map is still read, no longer
/// filled): about 10 MB per cache at most.
const CACHE_MAX: usize = 1 << 15;

#[derive(Default)]
struct Caches {
    chunked: bool,
    chunks: HashMap<String, u32>,
    chunk_ids: HashMap<String, Vec<u32>>,
    words: HashMap<String, u32>,
}

/// Reports whether a text's count is the sum of its space-separated chunks' counts.
fn chunkable(tk: &UnifiedTokenizer) -> bool {
    let t = match tk {
        UnifiedTokenizer::HuggingFace(t) => t,
        _ => return false,
    };
    matches!(t.get_normalizer(), None | Some(NormalizerWrapper::BertNormalizer(_)))
        && matches!(t.get_pre_tokenizer(), Some(PreTokenizerWrapper::BertPreTokenizer(_)))
        && t.get_added_vocabulary().get_added_tokens_decoder().values().all(|a| !a.content.chars().any(char::is_whitespace))
}

fn count(tk: &UnifiedTokenizer, text: &str, add_special_tokens: bool, caches: &mut Caches) -> Option<u32> {
    let t: &Tokenizer = match tk {
        UnifiedTokenizer::HuggingFace(t) => t,
        other => return other.encode(text, add_special_tokens).ok().map(|ids| ids.len() as u32),
    };
    let added = if add_special_tokens { t.get_post_processor().map_or(0, |p| p.added_tokens(false)) } else { 0 };
    // Truncation keeps max_length ids, special tokens included: the library subtracts them
    // from max_length first, wrapping when they do not fit (then nothing is truncated;
    // tokenize.Open rejects such a max_length), so the same wrapping subtraction here.
    let limit = t.get_truncation().map(|tr| tr.max_length.wrapping_sub(added));
    let n = if caches.chunked {
        let mut n = 0usize;
        for chunk in text.split(' ').filter(|c| !c.is_empty()) {
            n += match caches.chunks.get(chunk) {
                Some(&c) => c as usize,
                None => {
                    let c = content_tokens(t, chunk, None, &mut caches.words)?;
                    if caches.chunks.len() < CACHE_MAX {
                        caches.chunks.insert(chunk.to_owned(), c as u32);
                    }
                    c
                }
            };
            if limit.is_some_and(|l| n >= l) {
                break;
            }
        }
        n
    } else {
        content_tokens(t, text, limit, &mut caches.words)?
    };
    Some((limit.map_or(n, |l| n.min(l)) + added) as u32)
}

/// The number of tokens the model gives text before truncation and special tokens; it may
/// stop counting once limit is reached.
fn content_tokens(t: &Tokenizer, text: &str, limit: Option<usize>, words: &mut HashMap<String, u32>) -> Option<usize> {
    let mut pre = t.get_added_vocabulary().extract_and_normalize(t.get_normalizer(), text);
    if let Some(p) = t.get_pre_tokenizer() {
        tokenizers::tokenizer::PreTokenizer::pre_tokenize(p, &mut pre).ok()?;
    }
    let model = t.get_model();
    let cacheable = !matches!(model, ModelWrapper::BPE(_));
    let mut n = 0usize;
    for (s, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
        n += match tokens {
            Some(toks) => toks.len(),
            None if cacheable => match words.get(s) {
                Some(&c) => c as usize,
                None => {
                    let c = model.tokenize(s).ok()?.len();
                    if words.len() < CACHE_MAX {
                        words.insert(s.to_owned(), c as u32);
                    }
                    c
                }
            },
            None => model.tokenize(s).ok()?.len(),
        };
        if limit.is_some_and(|l| n >= l) {
            break;
        }
    }
    Some(n)
}

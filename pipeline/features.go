package pipeline

import (
	"context"
	"fmt"
	"image"
	"math"
	"sync"
	"sync/atomic"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/tokenize"
)

// headerReads are the prefix lengths ExtractFeatures tries, in order, to find an image's
// size without reading the file: most headers fit in 4 KiB, a JPEG with an EXIF thumbnail
// or an ICC profile before its frame header needs more, and as a last resort the whole
// file is read.
var headerReads = []int{4 << 10, 128 << 10}

// Features are the cheap, decode-free facts the planner needs: entry i's
// (Entry(i)) item, size and format, for i < Len(). The entries are not
// copied: Order[i] is entry i's position in the entries the features were
// built from (the index's, for Dataset.Epoch), 4 bytes where a copy of the
// entry would take 128.
type Features struct {
	Order []int32
	Items []balancer.Item
	// Sizes holds each image's display width and height (EXIF orientation applied).
	Sizes []image.Point
	// formats holds each image's format (Format(i)).
	formats formatColumn

	entries []loader.Entry   // what Order indexes, or
	view    loader.EntryView // the index entries Order indexes (entries nil)
	repeats []int32          // a mixture's repeat of each item (nil: none, mixture.go)
}

// NewFeatures returns the features of entries (item i of entries[i]: Order
// the identity), for a caller that builds them itself.
func NewFeatures(entries []loader.Entry, items []balancer.Item, sizes []image.Point, formats []string) Features {
	order := make([]int32, len(entries))
	for i := range order {
		order[i] = int32(i)
	}
	f := Features{Order: order, Items: items, Sizes: sizes, formats: newFormatColumn(len(formats)), entries: entries}
	for _, s := range formats {
		f.formats.append(s)
	}
	f.formats.done()
	return f
}

// FormatBytes is what the formats hold in memory (one byte an item while
// at most 256 distinct formats came).
func (f *Features) FormatBytes() int64 { return f.formats.bytes() }

// Format returns item i's image format (imgproc.Format*), sniffed from its
// header: with Sizes and the entry's ImageSize, what decoding it costs; ""
// for an item without one.
func (f *Features) Format(i int) string {
	if i < 0 || i >= f.formats.len() {
		return ""
	}
	return f.formats.at(i)
}

// Len is the number of entries.
func (f *Features) Len() int { return len(f.Order) }

// Entry returns entry i (the one of Items[i]); a mixture's repeated draw
// carries its draw id (loader.DrawID), as Items[i] does. Over a packed index
// it re-reads the entry's record (loader.Index): a path that needs only the
// id or the image size reads ID or ImageSize.
func (f *Features) Entry(i int) loader.Entry {
	var e loader.Entry
	if f.entries == nil && f.view != nil {
		e = f.view.Entry(int(f.Order[i]))
	} else {
		e = f.entries[f.Order[i]]
	}
	if f.repeats != nil && f.repeats[i] > 0 {
		e.ID = loader.DrawID(e.ID, int(f.repeats[i]))
	}
	return e
}

// ID returns entry i's id (Entry(i).ID) without materialising the entry.
func (f *Features) ID(i int) string {
	var id string
	if f.entries == nil && f.view != nil {
		id = f.view.ID(int(f.Order[i]))
	} else {
		id = f.entries[f.Order[i]].ID
	}
	if f.repeats != nil && f.repeats[i] > 0 {
		id = loader.DrawID(id, int(f.repeats[i]))
	}
	return id
}

// ImageSize returns entry i's ImageSize without materialising the entry.
func (f *Features) ImageSize(i int) int64 {
	if f.entries == nil && f.view != nil {
		return f.view.ImageSize(int(f.Order[i]))
	}
	return f.entries[f.Order[i]].ImageSize
}

// Repeat returns item i's repeat in a mixture epoch (0: its sample's first
// draw, and always for a plain input).
func (f *Features) Repeat(i int) int {
	if f.repeats == nil {
		return 0
	}
	return int(f.repeats[i])
}

// ExtractFeatures computes text tokens (tokenize, truncated), image tokens (from the image
// header and the resize policy) and header complexity for every entry, on workers
// goroutines, keeping the entries' order. Entries whose caption cannot be encoded or
// whose image header is unreadable go to q and are left out.
func ExtractFeatures(ctx context.Context, ix *loader.Index, entries []loader.Entry, tk *tokenize.Tokenizer,
	img imgproc.Config, q *loader.QuarantineWriter, workers int) (Features, error) {
	return extractFeatures(ctx, ix, entries, tk, img, q, workers, nil)
}

// extractFeatures is ExtractFeatures with a progress callback (Config.Progress).
func extractFeatures(ctx context.Context, ix *loader.Index, entries []loader.Entry, tk *tokenize.Tokenizer,
	img imgproc.Config, q *loader.QuarantineWriter, workers int, progress func(done, total int)) (Features, error) {
	all, err := computeFeatures(ctx, ix, listOf(entries), tk, img, workers, progress)
	if err != nil {
		return Features{}, err
	}
	if len(entries) > math.MaxInt32 {
		return Features{}, fmt.Errorf("pipeline: %d entries: more than %d", len(entries), math.MaxInt32)
	}
	f := Features{entries: entries}
	for i, ef := range all {
		if ef.Reject != nil {
			q.Write(*ef.Reject)
			continue
		}
		f.Order = append(f.Order, int32(i))
		f.Items = append(f.Items, ef.Item)
		f.Sizes = append(f.Sizes, ef.Size)
		f.formats.append(ef.Format)
	}
	f.formats.done()
	return f, q.Err()
}

// entryList is the entries a feature pass reads: n of them, materialised
// a range at a time (an index re-reads a range of records in one read).
type entryList struct {
	n     int
	slice func(lo, hi int) []loader.Entry
}

// listOf lists entries.
func listOf(entries []loader.Entry) entryList {
	return entryList{len(entries), func(lo, hi int) []loader.Entry { return entries[lo:hi] }}
}

// indexList lists the entries of ix.
func indexList(ix *loader.Index) entryList { return entryList{ix.Len(), ix.Entries} }

// computeFeatures computes the features of entries (rejects included), in
// their order, on workers goroutines, one chunk of captions at a time.
func computeFeatures(ctx context.Context, ix *loader.Index, entries entryList, tk *tokenize.Tokenizer,
	img imgproc.Config, workers int, progress func(done, total int)) ([]EntryFeatures, error) {
	out := make([]EntryFeatures, entries.n)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	chunks := (entries.n + featureChunk - 1) / featureChunk
	for range max(1, workers) {
		wg.Go(func() {
			texts := make([]string, 0, featureChunk)
			for ctx.Err() == nil {
				c := int(next.Add(1) - 1)
				if c >= chunks {
					return
				}
				lo, hi := c*featureChunk, min(entries.n, (c+1)*featureChunk)
				chunk := entries.slice(lo, hi)
				texts = texts[:0]
				for _, e := range chunk {
					texts = append(texts, e.Text)
				}
				// Token counts only, one cgo call per chunk (tokenize.CountBatch).
				counts, errs, err := tk.CountBatch(texts)
				for i := lo; i < hi; i++ {
					cerr := err
					if cerr == nil {
						cerr = errs[i-lo]
					}
					out[i] = featuresOf(ix, chunk[i-lo], counts, i-lo, cerr, img)
					if n := int(done.Add(1)); progress != nil && (n%64 == 0 || n == entries.n) {
						progress(n, entries.n)
					}
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// featureChunk is how many entries a feature worker takes at a time: their captions are
// counted in one batch.
const featureChunk = 64

// featuresOf builds one entry's features from its token count (counts[j], or countErr).
func featuresOf(ix *loader.Index, e loader.Entry, counts []int, j int, countErr error, img imgproc.Config) EntryFeatures {
	reject := func(reason string, err error) EntryFeatures {
		return EntryFeatures{Reject: &loader.Reject{ID: e.ID, Location: e.Location, Reason: reason, Detail: err.Error()}}
	}
	if countErr != nil {
		return reject(reasonOf(countErr), countErr)
	}
	if img.MaxFileBytes > 0 && e.ImageSize > int64(img.MaxFileBytes) {
		return reject(ReasonImageTooLarge, fmt.Errorf("pipeline: image %d bytes > limit %d: %w", e.ImageSize, img.MaxFileBytes, imgproc.ErrTooLarge))
	}
	h, err := readHeader(ix, e)
	if err != nil {
		return reject(reasonOf(err), err)
	}
	if err := checkPixels(h, img.MaxImagePixels); err != nil {
		return reject(ReasonImageTooLarge, err)
	}
	h.FileBytes = int(e.ImageSize)
	return EntryFeatures{Item: balancer.Item{
		ID:          e.ID,
		TextTokens:  counts[j],
		ImageTokens: img.ImageTokens(h.Width, h.Height),
		Complexity:  imgproc.HeaderComplexity(h),
	}, Size: image.Pt(h.Width, h.Height), Format: h.Format}
}

// checkPixels refuses a header that declares more than max pixels, naming the
// dimensions and the limit.
func checkPixels(h imgproc.Header, max int) error {
	if n := int64(h.Width) * int64(h.Height); n > int64(max) {
		return fmt.Errorf("pipeline: %s %dx%d = %d pixels > limit %d: %w", h.Format, h.Width, h.Height, n, max, imgproc.ErrTooLarge)
	}
	return nil
}

// readHeader parses the image header from growing prefixes of the file.
func readHeader(ix *loader.Index, e loader.Entry) (imgproc.Header, error) {
	var lastErr error
	for _, n := range headerReads {
		head, err := readWithRetry(context.Background(), func() ([]byte, error) { return ix.ReadHeader(e, n) })
		if err != nil {
			return imgproc.Header{}, fmt.Errorf("%w: %w", errUnreadable, err)
		}
		h, err := imgproc.ReadHeader(head)
		if err == nil || int64(len(head)) >= e.ImageSize {
			return h, err
		}
		lastErr = err
	}
	full, err := readWithRetry(context.Background(), func() ([]byte, error) { return ix.ReadImage(e) })
	if err != nil {
		return imgproc.Header{}, fmt.Errorf("%w: %w (after %v)", errUnreadable, err, lastErr)
	}
	return imgproc.ReadHeader(full)
}

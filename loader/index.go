package loader

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"runtime"
	"slices"
	"sync"
	"unsafe"
)

// refKind says how an Entry's image bytes are re-read.
type refKind uint8

const (
	refNone    refKind = iota // foreign source: cannot re-read
	refFile                   // a whole file at path
	refTar                    // size bytes at offset off of the tar at path
	refTarGz                  // size bytes at offset off of the inflated .tar.gz at path
	refParquet                // row row of row group rg of the Parquet file at path
	refArrow                  // row row of the record batch rg, whose first message is at off, of the Arrow file at path
	refStale                  // a packed entry whose record no longer reads as indexed (path: why)
)

// imageRef locates an image for re-reading. A local file is opened with
// openIn(root, path): below root, which the source resolved when it listed
// the file (path absolute or relative to root: a manifest keeps the line's
// own relative path, the string its ImageName shares); root "" opens path as
// given (an allowed absolute path, an object key of Options.Remote, a spool
// file).
type imageRef struct {
	kind refKind
	part uint16 // the part of a mixture's index (CombineIndexes) that reads it
	keep uint32 // 1 + the entry's row in Index.keep (0: none); here it fills kind's padding
	root string
	path string
	off  int64
	rg   int32
	row  int32
}

// Entry is the cheap, in-memory view of one sample: everything planning
// needs, without image bytes.
type Entry struct {
	ID        string // see Sample.ID
	Location  string // see Sample.Location
	Text      string // caption
	ImageName string // file-name hint
	ImageSize int64  // encoded image size in bytes
	ref       imageRef
}

func (e Entry) sample(img []byte) Sample {
	return Sample{ID: e.ID, Location: e.Location, Text: e.Text, Image: img, ImageName: e.ImageName}
}

// Index is the planning view of a dataset: all good entries in source order,
// plus the counters of the scan. Stats must not be modified. Entry i is
// read with Entry(i) (a range with Entries, its id alone with ID); every
// method is safe for concurrent use.
//
// A manifest's index keeps each entry compactly (the id, where its line
// is, the image size: about 45 bytes for a short id) and re-reads the line
// whenever an entry is materialised, so Text, Location, ImageName and the
// image reference are the strings of the line; an entry whose line no
// longer reads as indexed (its bytes' checksum, or its id, changed)
// materialises stale: its image reads fail with ErrStale, so it is
// quarantined where its image would be read. Other sources keep their
// entries whole.
type Index struct {
	// Stats counts the scan, duplicates included:
	// Seen == Len() + Quarantined.
	Stats Stats

	entries []Entry        // the entries, kept whole (packed nil)
	packed  *packedEntries // the entries in compact columns, else nil
	strs    stringArena    // the strings of whole entries read in records mode

	opts  Options
	keep  *keepTable // the kept fields' values (Options.Keep), nil without
	pq    *rowGroupCache
	gz    *gzSpools
	parts []*Index // a mixture's sources (CombineIndexes): each entry is read by its part
}

// Scan reads all entries of src into an Index. Built-in sources (from Open)
// do not read image bytes (Parquet reads the image column to learn sizes, one
// row group at a time, and drops it). Another Source falls back to Next: its
// entries keep sizes but not the bytes, and ReadImage returns ErrNoImageRef.
// Entries whose id was already seen are quarantined as "duplicate_id"
// (through the source's OnReject for built-in sources). Scan does not close
// src.
func Scan(ctx context.Context, src Source) (*Index, error) {
	ix := &Index{opts: DefaultOptions(), pq: newRowGroupCache(2)}
	var t Tally
	onReject := func(Reject) {}
	er, _ := src.(entryReader)
	if er != nil {
		ix.opts = er.shared().opts
		if f := ix.opts.OnReject; f != nil {
			onReject = f
		}
	}
	if len(ix.opts.Keep) > 0 {
		ix.keep = newKeepTable(ix.opts.Keep)
	}
	rs, _ := src.(recordSource)
	if rs != nil {
		rs.packRecords()
		ix.packed = &packedEntries{}
	}
	seen := make(map[uint64]int32)
	seed := maphash.MakeSeed()
	for {
		e, err := scanNext(ctx, src)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			ix.closeFiles()
			return nil, err
		}
		h := maphash.String(seed, e.ID)
		if j, ok := seen[h]; ok && ix.ID(int(j)) == e.ID {
			t.Quarantine(ReasonDuplicateID)
			onReject(Reject{ID: e.ID, Location: e.Location, Reason: ReasonDuplicateID,
				Detail: "first seen at " + ix.Entry(int(j)).Location})
			continue
		} else if !ok {
			seen[h] = int32(ix.Len())
		}
		t.Emit()
		if ix.keep != nil {
			e.ref.keep = ix.keep.add(extractKeep(ix.keep.fields, lastJSON(er), e.Text))
		}
		ix.add(e, rs)
	}
	if ix.packed != nil {
		ix.packed.done()
		runtime.AddCleanup(ix, func(p *packedEntries) { p.close() }, ix.packed)
	}
	ix.entries = slices.Clone(ix.entries) // no spare capacity: up to a quarter of the entries after append's growth
	ix.Stats = mergeStats(src.Stats(), t.Stats())
	ix.gz = newGzSpools(ix.opts.SpoolDir, ix.entries, ix.opts.Remote)
	return ix, nil
}

// add appends e: packed when its source located its record and the
// columns hold it, else whole (and every packed entry before it turns
// whole: an index keeps one form). A whole entry read by a source in
// records mode gets its own copies of its strings.
func (ix *Index) add(e Entry, rs recordSource) {
	if ix.packed != nil {
		if r, ok := rs.lastRecord(); ok && ix.packed.add(e, r) {
			return
		}
		ix.entries = ix.packed.entries(0, ix.packed.len())
		ix.closeFiles()
		ix.packed = nil
	}
	if rs != nil {
		e = ix.strs.entry(e)
	}
	ix.entries = append(ix.entries, e)
}

// release drops the entries (CombineIndexes: the mixture keeps its own)
// and closes the files a packed index holds open.
func (ix *Index) release() {
	ix.closeFiles()
	ix.entries, ix.packed = nil, nil
}

func (ix *Index) closeFiles() {
	if ix.packed != nil {
		ix.packed.close()
	}
}

// IndexOf returns an index over entries, kept whole (a caller's own
// listing, a test): their images cannot be re-read (ErrNoImageRef).
func IndexOf(entries []Entry) *Index {
	ix := &Index{opts: DefaultOptions(), pq: newRowGroupCache(2), entries: slices.Clone(entries)}
	for i := range ix.entries {
		ix.entries[i].ref = imageRef{}
	}
	ix.Stats = Stats{Seen: int64(len(entries)), Emitted: int64(len(entries)), ByReason: map[string]int64{}}
	return ix
}

// scanNext returns the next entry without image bytes when src allows it.
func scanNext(ctx context.Context, src Source) (Entry, error) {
	if er, ok := src.(entryReader); ok {
		e, _, err := er.next(ctx, false)
		return e, err
	}
	s, err := src.Next(ctx)
	if err != nil {
		return Entry{}, err
	}
	return Entry{ID: s.ID, Location: s.Location, Text: s.Text, ImageName: s.ImageName,
		ImageSize: int64(len(s.Image))}, nil
}

// mergeStats combines the source's counters with the index's own pass
// (which re-counts the source's emitted samples as seen).
func mergeStats(src, ix Stats) Stats {
	out := Stats{
		Seen:        src.Seen,
		Emitted:     ix.Emitted,
		Quarantined: src.Quarantined + ix.Quarantined,
		ByReason:    src.ByReason,
	}
	if out.ByReason == nil {
		out.ByReason = map[string]int64{}
	}
	for r, n := range ix.ByReason {
		out.ByReason[r] += n
	}
	return out
}

// BuildIndex opens path, scans it and closes the source.
func BuildIndex(ctx context.Context, path string, opts Options) (*Index, error) {
	src, err := Open(path, opts)
	if err != nil {
		return nil, err
	}
	ix, err := Scan(ctx, src)
	return ix, errors.Join(err, src.Close())
}

// Len returns the number of entries.
func (ix *Index) Len() int {
	if ix.packed != nil {
		return ix.packed.len()
	}
	return len(ix.entries)
}

// ID returns entry i's id without materialising the entry.
func (ix *Index) ID(i int) string {
	if ix.packed != nil {
		return ix.packed.id(i)
	}
	return ix.entries[i].ID
}

// Entry returns entry i (0 <= i < Len()); a packed index re-reads its
// record (see Index).
func (ix *Index) Entry(i int) Entry {
	if ix.packed != nil {
		return ix.packed.entries(i, i+1)[0]
	}
	return ix.entries[i]
}

// Entries returns entries [lo, hi) in a new slice, a packed index reading
// consecutive records in one read.
func (ix *Index) Entries(lo, hi int) []Entry {
	if lo < 0 || hi > ix.Len() || lo > hi {
		panic(fmt.Sprintf("loader: entries [%d, %d) of %d", lo, hi, ix.Len()))
	}
	if ix.packed != nil {
		return ix.packed.entries(lo, hi)
	}
	return slices.Clone(ix.entries[lo:hi])
}

// EntryBytes is what the index holds per entry outside strings, for all
// entries: a packed index's fixed-size columns (its ids not counted),
// else the Entry structs.
func (ix *Index) EntryBytes() int64 {
	if p := ix.packed; p != nil {
		return int64(cap(p.recs))*int64(unsafe.Sizeof(packedRec{})) + int64(cap(p.idEnd))*4
	}
	return int64(cap(ix.entries)) * int64(unsafe.Sizeof(Entry{}))
}

// EntryView reads an index's entries, holding nothing of the index but
// them (no caches, no open files): what a pipeline's Features keep.
type EntryView interface {
	Len() int
	Entry(i int) Entry
	ID(i int) string       // entry i's id, without materialising it
	ImageSize(i int) int64 // entry i's ImageSize, without materialising it
}

// View returns the entries of ix as an EntryView.
func (ix *Index) View() EntryView {
	if ix.packed != nil {
		return ix.packed
	}
	return wholeEntries(ix.entries)
}

// wholeEntries is the EntryView of entries kept whole.
type wholeEntries []Entry

func (w wholeEntries) Len() int              { return len(w) }
func (w wholeEntries) Entry(i int) Entry     { return w[i] }
func (w wholeEntries) ID(i int) string       { return w[i].ID }
func (w wholeEntries) ImageSize(i int) int64 { return w[i].ImageSize }

// ImageSize returns entry i's ImageSize without materialising the entry.
func (ix *Index) ImageSize(i int) int64 {
	if ix.packed != nil {
		return ix.packed.ImageSize(i)
	}
	return ix.entries[i].ImageSize
}

// All returns every entry: Entries(0, Len()).
func (ix *Index) All() []Entry { return ix.Entries(0, ix.Len()) }

// Sample re-reads entry i's image and returns the full sample.
func (ix *Index) Sample(i int) (Sample, error) {
	if i < 0 || i >= ix.Len() {
		return Sample{}, fmt.Errorf("loader: sample %d out of range [0,%d)", i, ix.Len())
	}
	e := ix.Entry(i)
	img, err := ix.ReadImage(e)
	if err != nil {
		return Sample{}, err
	}
	return e.sample(img), nil
}

// ReadImage re-reads the entry's image bytes. The size must still match
// the index (else ErrStale).
func (ix *Index) ReadImage(e Entry) ([]byte, error) {
	return ix.read(context.Background(), e, -1)
}

// ReadImageContext is ReadImage that stops when ctx is done (checked between
// chunks of a long read).
func (ix *Index) ReadImageContext(ctx context.Context, e Entry) ([]byte, error) {
	return ix.read(ctx, e, -1)
}

// ReadHeader returns up to the first n bytes of the entry's image (enough
// for format sniffing and dimensions; 64 KiB is plenty).
func (ix *Index) ReadHeader(e Entry, n int) ([]byte, error) {
	if n < 0 {
		n = 0
	}
	return ix.read(context.Background(), e, n)
}

// read returns the first n bytes of the image, or all of it when n < 0.
func (ix *Index) read(ctx context.Context, e Entry, n int) ([]byte, error) {
	if ix.parts != nil && int(e.ref.part) < len(ix.parts) {
		return ix.parts[e.ref.part].read(ctx, e, n)
	}
	if e.ImageSize > ix.opts.MaxImageBytes {
		return nil, fmt.Errorf("loader: read %s: image %d bytes > max %d: %w", e.Location, e.ImageSize, ix.opts.MaxImageBytes, ErrTooLarge)
	}
	want := e.ImageSize
	if n >= 0 && int64(n) < want {
		want = int64(n)
	}
	switch e.ref.kind {
	case refStale:
		return nil, staleErr(e)
	case refFile:
		return readFileRange(ctx, e, 0, want, true)
	case refTar:
		if ix.opts.Remote != nil {
			return readRemote(ctx, ix.opts.Remote, e, want)
		}
		return readFileRange(ctx, e, e.ref.off, want, false)
	case refTarGz:
		return ix.gz.read(ctx, e, want)
	case refParquet, refArrow:
		img, err := ix.pq.image(ix.opts, e.ref)
		if err != nil {
			return nil, fmt.Errorf("loader: read %s: %w", e.Location, err)
		}
		if int64(len(img)) != e.ImageSize {
			return nil, fmt.Errorf("loader: read %s: %w", e.Location, ErrStale)
		}
		return img[:want], nil
	}
	return nil, fmt.Errorf("loader: read %s: %w", e.Location, ErrNoImageRef)
}

// readFileRange reads want bytes at off, never blocking on a file that is
// no longer regular and stopping when ctx is done. For whole files
// (checkSize) the file's current size must equal the indexed size.
func readFileRange(ctx context.Context, e Entry, off, want int64, checkSize bool) ([]byte, error) {
	f, fi, err := openIn(e.ref.root, e.ref.path)
	if err != nil {
		return nil, fmt.Errorf("loader: read %s: %w", e.Location, err)
	}
	defer f.Close()
	if checkSize && fi.Size() != e.ImageSize {
		return nil, fmt.Errorf("loader: read %s: size %d, indexed %d: %w", e.Location, fi.Size(), e.ImageSize, ErrStale)
	}
	if off+want > fi.Size() {
		return nil, fmt.Errorf("loader: read %s: %d bytes at %d past the end (%d): %w", e.Location, want, off, fi.Size(), ErrStale)
	}
	buf := make([]byte, want)
	if err := readFull(ctx, io.NewSectionReader(f, off, want), buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = ErrStale
		}
		return nil, fmt.Errorf("loader: read %s: %w", e.Location, err)
	}
	return buf, nil
}

// Close releases cached Parquet row groups, closes the manifests a packed
// index holds open and removes the inflated copies of .tar.gz shards. The
// index stays readable (a later read opens or inflates again).
func (ix *Index) Close() error {
	if ix.parts != nil {
		return closeParts(ix.parts)
	}
	ix.pq.clear()
	var err error
	if ix.packed != nil {
		err = ix.packed.close()
	}
	if ix.gz != nil {
		err = errors.Join(err, ix.gz.close())
	}
	return err
}

// rowGroupCache keeps the image columns of the last few Parquet row groups
// read by ReadImage, so reading entries in (file, row group) order reads
// each row group once.
type rowGroupCache struct {
	mu    sync.Mutex
	max   int
	order []rgKey
	cols  map[rgKey]*imageColumn
}

type rgKey struct {
	path string
	rg   int32
}

func newRowGroupCache(max int) *rowGroupCache {
	return &rowGroupCache{max: max, cols: map[rgKey]*imageColumn{}}
}

// image returns a copy of the bytes of row ref.row, loading the row group's
// image column on a miss.
func (c *rowGroupCache) image(opts Options, ref imageRef) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := rgKey{ref.path, ref.rg}
	col, ok := c.cols[k]
	if !ok {
		var err error
		col, err = loadTableImage(opts, ref)
		if err != nil {
			return nil, err
		}
		c.cols[k] = col
		c.order = append(c.order, k)
		if len(c.order) > c.max {
			old := c.order[0]
			c.order = c.order[1:]
			c.cols[old].release()
			delete(c.cols, old)
		}
	}
	img, _, ok := col.at(int(ref.row))
	if !ok {
		return nil, ErrStale
	}
	return append([]byte(nil), img...), nil
}

func (c *rowGroupCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, col := range c.cols {
		col.release()
		delete(c.cols, k)
	}
	c.order = nil
}

package loader

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"unsafe"
)

// record locates the source record an entry was read from (a manifest
// line, a WebDataset shard's caption member), so the index can drop the
// entry's strings and re-read them.
type record struct {
	file *recordFile
	off  int64     // the record's first byte in the file
	n    uint32    // its length in bytes
	line uint32    // its line number (Location; manifests)
	sum  uint16    // recordSum of its bytes
	tar  tarRecord // the rest of a WebDataset entry (file.tar)
	// plain: the image reference is the one the record names (the
	// manifest folder's resolved root and the line's own image string);
	// else the index keeps the entry's root and path.
	plain bool
	ok    bool // the line fits the columns
}

// recordSource is a built-in source whose entries the index can re-read
// from their records: manifests and local uncompressed WebDataset shards.
type recordSource interface {
	// packRecords switches the source to records: an entry read without
	// its image keeps no copies of its strings.
	packRecords()
	// lastRecord locates the entry next returned last; ok false when it
	// cannot be re-read (the index then keeps entries whole).
	lastRecord() (record, bool)
}

// recordFile is one file records are re-read from: plain values (no open
// file: each read opens it), so two indexes of the same data compare equal
// with reflect.DeepEqual, as whole entries do.
type recordFile struct {
	loc        string // the file as locations name it
	root, path string // the file, opened with openIn(root, path)
	imgRoot    string // manifests: the resolved root a plain entry's image path is below
	name       string // manifests: the base name derived ids use
	fields     manifestFields
	tar        bool    // a WebDataset shard: records are caption members
	keys       wdsKeys // its keys
}

// heldRecords holds the open file of the first maxHeld manifests of each
// packed index, so a manifest removed or replaced after indexing still
// reads as indexed (a dataset is opened once); kept out of recordFile so
// that its values stay comparable. Other record files open per read.
var heldRecords sync.Map // *recordFile → *os.File

// maxHeld is how many manifests an index keeps open.
const maxHeld = 64

// hold opens rf and keeps it open until release.
func (rf *recordFile) hold() {
	if f, _, err := openIn(rf.root, rf.path); err == nil {
		heldRecords.Store(rf, f)
	}
}

// release closes the file hold opened (a later read opens it again).
func (rf *recordFile) release() error {
	if f, ok := heldRecords.LoadAndDelete(rf); ok {
		return f.(*os.File).Close()
	}
	return nil
}

// readAt reads len(buf) bytes at off.
func (rf *recordFile) readAt(buf []byte, off int64) error {
	var f *os.File
	if held, ok := heldRecords.Load(rf); ok {
		f = held.(*os.File)
	} else {
		var err error
		if f, _, err = openIn(rf.root, rf.path); err != nil {
			return err
		}
		defer f.Close()
	}
	if _, err := f.ReadAt(buf, off); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

// parse re-reads a manifest line: ok false when it no longer parses.
func (rf *recordFile) parse(line []byte) (manifestLine, string, bool) {
	ml, reason, _ := parseManifestFields(line, rf.fields)
	if reason != "" {
		return ml, "", false
	}
	return ml, manifestID(rf.name, ml), true
}

// packedRec is one entry's fixed-size part: 32 bytes.
type packedRec struct {
	off  int64  // record offset
	size int64  // ImageSize
	n    uint32 // record length
	aux  uint32 // manifests: the line number; shards: the text key's rank | the image name's suffix << 8
	keep uint32 // imageRef.keep
	file uint16 // index into packedEntries.files
	sum  uint16 // a checksum of the record's bytes, to tell a changed record
}

// packedEntries holds an index's entries in compact columns: each id end
// to end in one byte slice, a packedRec, and the image references that
// are not the ones their records name. Text, Location, ImageName and the
// image path are re-read from the record when an entry is materialised.
// Built by add (not safe for concurrent use), then read-only.
type packedEntries struct {
	ids   []byte
	idEnd []uint32 // id i is ids[idEnd[i-1]:idEnd[i]]
	recs  []packedRec
	files []*recordFile
	refs  map[int32]imageRef // entries whose root and path are not their record's
	tar   packedTar          // the columns of WebDataset entries
}

// maxSpan is the most bytes one read of consecutive records takes.
const maxSpan = 1 << 20

// add appends entry e, read from r; ok false when the columns cannot hold
// it (then the index keeps its entries whole).
func (p *packedEntries) add(e Entry, r record) bool {
	if len(p.ids)+len(e.ID) > math.MaxUint32 || len(p.recs) >= math.MaxInt32 {
		return false
	}
	f := len(p.files) - 1
	if f < 0 || p.files[f] != r.file {
		if f = slices.Index(p.files, r.file); f < 0 {
			if len(p.files) > math.MaxUint16 {
				return false
			}
			f = len(p.files)
			p.files = append(p.files, r.file)
			if !r.file.tar && f < maxHeld {
				r.file.hold()
			}
		}
	}
	aux := r.line
	if r.file.tar {
		var ok bool
		if aux, ok = p.tar.add(len(p.recs), e, r.tar); !ok {
			return false
		}
	} else if !r.plain {
		if p.refs == nil {
			p.refs = map[int32]imageRef{}
		}
		p.refs[int32(len(p.recs))] = imageRef{root: e.ref.root, path: e.ref.path}
	}
	p.ids = append(p.ids, e.ID...)
	p.idEnd = append(p.idEnd, uint32(len(p.ids)))
	p.recs = append(p.recs, packedRec{off: r.off, size: e.ImageSize, n: r.n, aux: aux,
		keep: e.ref.keep, file: uint16(f), sum: r.sum})
	return true
}

// done drops the spare capacity of the columns.
func (p *packedEntries) done() {
	p.ids, p.idEnd, p.recs = slices.Clip(slices.Clone(p.ids)), slices.Clone(p.idEnd), slices.Clone(p.recs)
	p.tar.done()
}

func (p *packedEntries) len() int { return len(p.recs) }

// id returns entry i's id, sharing the column's bytes.
func (p *packedEntries) id(i int) string {
	lo := uint32(0)
	if i > 0 {
		lo = p.idEnd[i-1]
	}
	hi := p.idEnd[i]
	if lo == hi {
		return ""
	}
	return unsafe.String(&p.ids[lo], int(hi-lo))
}

// entries materialises entries [lo, hi), reading consecutive records of a
// file in one read of at most maxSpan bytes.
func (p *packedEntries) entries(lo, hi int) []Entry {
	out := make([]Entry, 0, hi-lo)
	var buf []byte
	for i := lo; i < hi; {
		j, end := i+1, p.recs[i].off+int64(p.recs[i].n)
		for j < hi && p.recs[j].file == p.recs[i].file && p.recs[j].off >= end &&
			p.recs[j].off+int64(p.recs[j].n)-p.recs[i].off <= maxSpan {
			end = p.recs[j].off + int64(p.recs[j].n)
			j++
		}
		start := p.recs[i].off
		buf = slices.Grow(buf[:0], int(end-start))[:end-start]
		err := p.files[p.recs[i].file].readAt(buf, start)
		if err != nil && j > i+1 { // one record at a time: the good ones still read
			j = i + 1
			buf = buf[:p.recs[i].n]
			err = p.files[p.recs[i].file].readAt(buf, start)
		}
		for k := i; k < j; k++ {
			var rec []byte
			if err == nil {
				r := p.recs[k]
				rec = buf[r.off-start : r.off-start+int64(r.n)]
			}
			out = append(out, p.entry(k, rec, err))
		}
		i = j
	}
	return out
}

// entry materialises entry i from its record's bytes (rec, or the error
// reading them). A record that no longer reads as it did gives a stale
// entry: its image reads fail with ErrStale.
func (p *packedEntries) entry(i int, rec []byte, err error) Entry {
	r := p.recs[i]
	rf := p.files[r.file]
	if err == nil && recordSum(rec) != r.sum {
		err = errChanged
	}
	if rf.tar {
		return p.tar.entry(i, p.id(i), r, rf, rec, err)
	}
	e := Entry{ID: p.id(i), Location: rf.loc + ":" + strconv.FormatUint(uint64(r.aux), 10), ImageSize: r.size}
	e.ref.keep = r.keep
	var ml manifestLine
	if err == nil {
		var ok bool
		var id string
		if ml, id, ok = rf.parse(rec); !ok || id != e.ID {
			err = errChanged
		}
	}
	if err != nil {
		return stale(e, err)
	}
	e.Text, e.ImageName = ml.Text, baseName(ml.Image)
	e.ref.kind, e.ref.root, e.ref.path = refFile, rf.imgRoot, ml.Image
	if ref, ok := p.refs[int32(i)]; ok {
		e.ref.root, e.ref.path = ref.root, ref.path
	}
	return e
}

// close releases the files held open.
func (p *packedEntries) close() error {
	var errs []error
	for _, rf := range p.files {
		errs = append(errs, rf.release())
	}
	return errors.Join(errs...)
}

// errChanged says a record no longer reads as indexed.
var errChanged = errors.New("record changed since it was indexed")

// staleErrs are what a stale entry's reads fail with: ErrStale, or the
// sentinel the record's read failed with (imageRef.row holds the position).
var staleErrs = []error{ErrStale, ErrEscapesRoot, ErrNotRegular, fs.ErrNotExist, ErrTooLarge}

// stale returns e marked stale by err: its image reads fail with the
// sentinel err wraps, else ErrStale.
func stale(e Entry, err error) Entry {
	e.ref.kind, e.ref.root, e.ref.path, e.ref.row = refStale, "", err.Error(), 0
	for i, s := range staleErrs {
		if i > 0 && errors.Is(err, s) {
			e.ref.row = int32(i)
		}
	}
	return e
}

// staleErr is the error a stale entry's reads fail with.
func staleErr(e Entry) error {
	s := ErrStale
	if int(e.ref.row) < len(staleErrs) {
		s = staleErrs[e.ref.row]
	}
	return fmt.Errorf("loader: read %s: %s: %w", e.Location, e.ref.path, s)
}

// recordSum is the 16-bit checksum packedRec keeps of a record.
func recordSum(b []byte) uint16 {
	h := fnv.New32a()
	h.Write(b)
	s := h.Sum32()
	return uint16(s ^ s>>16)
}

// Len implements EntryView.
func (p *packedEntries) Len() int { return p.len() }

// Entry implements EntryView.
func (p *packedEntries) Entry(i int) Entry { return p.entries(i, i+1)[0] }

// ID implements EntryView.
func (p *packedEntries) ID(i int) string { return p.id(i) }

// ImageSize implements EntryView.
func (p *packedEntries) ImageSize(i int) int64 { return p.recs[i].size }

package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
)

// ErrMalformedArrow wraps an Arrow IPC file the loader cannot read.
var ErrMalformedArrow = errors.New("loader: malformed Arrow IPC file")

// maxArrowMetadata bounds one IPC message's metadata (a schema or a batch
// header; a few KiB in practice).
const maxArrowMetadata = 1 << 20

// arrowMagic opens an Arrow IPC file (as opposed to a stream): 6 bytes and 2
// of padding, after which the file holds a stream (ended by its end-of-stream
// marker, before the footer).
var arrowMagic = []byte("ARROW1")

// arrowReader reads a file from a position it keeps, readChunk bytes at a
// time, checking ctx between reads: checkedMessages reads through it, and a
// re-read moves pos to a record batch's first message.
type arrowReader struct {
	ctx context.Context
	f   *os.File
	pos int64
}

func (r *arrowReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := r.f.ReadAt(p[:min(len(p), readChunk)], r.pos)
	r.pos += int64(n)
	if n > 0 && errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

// arrowFile is one open Arrow IPC file with its resolved columns.
type arrowFile struct {
	f                *os.File
	pr               *arrowReader
	rd               *ipc.Reader
	img, text, idCol int
	keep             map[string]int // the kept fields' columns (parquetkeep.go)
}

// openArrow opens the Arrow file path below root, reads its schema and
// resolves the columns (ErrSchema when they are missing or of the wrong
// type, ErrMalformedArrow when the schema cannot be read).
func openArrow(ctx context.Context, root, path string, opts Options) (*arrowFile, error) {
	f, fi, err := openIn(root, path)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	a := &arrowFile{f: f, pr: &arrowReader{ctx: ctx, f: f}}
	var head [8]byte
	if n, _ := f.ReadAt(head[:], 0); n == len(head) && bytes.HasPrefix(head[:], arrowMagic) {
		a.pr.pos = 8
	}
	mr := &checkedMessages{r: a.pr, size: fi.Size(), maxBody: opts.MaxRowGroupBytes} // hfdisk_ipc.go
	if a.rd, err = ipc.NewReaderFromMessageReader(mr); err != nil {
		f.Close()
		return nil, fmt.Errorf("loader: open %s: %w: %v", path, ErrMalformedArrow, err)
	}
	if err := a.resolve(opts); err != nil {
		a.close()
		return nil, fmt.Errorf("loader: %s: %w", path, err)
	}
	return a, nil
}

// resolve finds the columns in the schema and checks their types.
func (a *arrowFile) resolve(opts Options) error {
	sc := a.rd.Schema()
	for _, f := range sc.Fields() {
		if f.Type.ID() == arrow.DICTIONARY { // its batches could not be re-read one by one
			return fmt.Errorf("%w: dictionary-encoded column %q", ErrSchema, f.Name)
		}
	}
	a.img, a.text, a.idCol = imageFieldIndex(sc, opts.ImageColumn), fieldIndex(sc, opts.TextColumn), fieldIndex(sc, opts.IDColumn)
	if a.img < 0 || a.text < 0 {
		return fmt.Errorf("%w: lacks column %q or %q (have %v)", ErrSchema, opts.ImageColumn, opts.TextColumn, fieldNames(sc))
	}
	a.keep = keepColumns(sc, opts.Keep)
	return checkTypes(sc.Field(a.img).Type, sc.Field(a.text).Type)
}

func fieldNames(sc *arrow.Schema) []string {
	out := make([]string, 0, sc.NumFields())
	for _, f := range sc.Fields() {
		out = append(out, f.Name+" "+f.Type.String())
	}
	return out
}

func (a *arrowFile) close() error {
	a.rd.Release()
	return a.f.Close()
}

// nextBatch reads the next record batch into a rowGroup; off is where its
// first message starts. io.EOF after the last.
func (a *arrowFile) nextBatch() (g *rowGroup, off int64, err error) {
	off = a.pr.pos
	if !a.rd.Next() {
		if err := a.rd.Err(); err != nil {
			return nil, off, err
		}
		return nil, off, io.EOF
	}
	g, err = a.rowGroup(a.rd.RecordBatch())
	return g, off, err
}

// rowGroup checks the batch's columns (offsets inside their buffers) and
// gives row access to them.
func (a *arrowFile) rowGroup(rec arrow.RecordBatch) (g *rowGroup, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrMalformedArrow, r)
		}
	}()
	g = &rowGroup{}
	cols := []int{a.img, a.text}
	if a.idCol >= 0 {
		cols = append(cols, a.idCol)
	}
	for _, i := range a.keep {
		cols = append(cols, i)
	}
	for _, i := range cols {
		if err := validateColumn(rec.Column(i)); err != nil {
			return nil, fmt.Errorf("%w: column %q: %v", ErrMalformedArrow, rec.ColumnName(i), err)
		}
	}
	chunked := func(i int) *arrow.Chunked {
		return arrow.NewChunked(rec.Column(i).DataType(), []arrow.Array{rec.Column(i)})
	}
	if g.img, err = newImageColumn(chunked(a.img)); err != nil {
		return nil, err
	}
	if g.text, err = newScalarColumn(chunked(a.text), true); err == nil && a.idCol >= 0 {
		g.id, _ = newScalarColumn(chunked(a.idCol), false)
	}
	for name, i := range a.keep {
		g.keep = append(g.keep, newKeptColumn(name, chunked(i)))
	}
	if err == nil {
		err = g.checkLengths()
	}
	if err != nil {
		g.release()
		return nil, err
	}
	g.rows = g.img.col.Len()
	return g, nil
}

// validateColumn checks an array and, for a struct, its fields.
func validateColumn(a arrow.Array) error {
	if err := array.ValidateFull(a); err != nil {
		return err
	}
	if st, ok := a.(*array.Struct); ok {
		for i := range st.NumField() {
			if err := array.ValidateFull(st.Field(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadArrowImageColumn re-reads the image column of the record batch whose
// first message starts at ref.off.
func loadArrowImageColumn(opts Options, ref imageRef) (*imageColumn, error) {
	a, err := openArrow(context.Background(), ref.root, ref.path, opts)
	if err != nil {
		return nil, err
	}
	defer a.close()
	a.pr.pos = ref.off
	g, _, err := a.nextBatch()
	if errors.Is(err, io.EOF) {
		err = ErrStale
	}
	if err != nil {
		return nil, err
	}
	img := g.img
	g.img = nil
	g.release()
	return img, nil
}

// loadTableImage loads the image column a Parquet or Arrow reference names.
func loadTableImage(opts Options, ref imageRef) (*imageColumn, error) {
	if ref.kind == refArrow {
		return loadArrowImageColumn(opts, ref)
	}
	return loadImageColumn(opts, ref.root, ref.path, int(ref.rg))
}

// arrowSource reads Arrow IPC files record batch by record batch.
type arrowSource struct {
	base
	files   []string
	fi      int    // index of the open file
	root    string // the open file's folder, resolved by pinFile
	path    string // the open file, resolved by pinFile
	cur     *arrowFile
	batch   int   // index of g in the file
	off     int64 // where g's first message starts
	g       *rowGroup
	row     int   // next row of g
	fileRow int64 // row number in the file of row 0 of g
	usable  bool  // some file had a readable schema
	lastBad string
	imgs    *imageFiles
}

func newArrowSource(files []string, opts Options) *arrowSource {
	return &arrowSource{base: base{opts: opts}, files: files, fi: -1}
}

// Next implements Source.
func (s *arrowSource) Next(ctx context.Context) (Sample, error) { return nextSample(ctx, s) }

// Close implements Source.
func (s *arrowSource) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.closeFile()
}

func (s *arrowSource) closeFile() error {
	if s.g != nil {
		s.g.release()
		s.g = nil
	}
	if s.cur == nil {
		return nil
	}
	err := s.cur.close()
	s.cur = nil
	return err
}

func (s *arrowSource) next(ctx context.Context, withImage bool) (Entry, []byte, error) {
	if s.closed {
		return Entry{}, nil, ErrClosed
	}
	for {
		if err := ctx.Err(); err != nil {
			return Entry{}, nil, err
		}
		if s.g == nil || s.row >= s.g.rows {
			if err := s.advance(ctx); err != nil {
				return Entry{}, nil, err
			}
			continue
		}
		if e, img, ok := s.entry(ctx, withImage); ok {
			s.tally.Emit()
			return e, img, nil
		}
	}
}

// advance moves to the next record batch, opening the next file when
// needed; io.EOF after the last file.
func (s *arrowSource) advance(ctx context.Context) error {
	if s.g != nil {
		s.fileRow += int64(s.g.rows)
		s.batch++
		s.g.release()
		s.g = nil
	}
	for {
		if s.cur == nil {
			if err := s.openNext(ctx); err != nil {
				return err
			}
			continue
		}
		g, off, err := s.cur.nextBatch()
		if err == nil {
			s.g, s.off, s.row = g, off, 0
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, io.EOF) {
			s.rejectRest(err)
		}
		if err := s.closeFile(); err != nil {
			return fmt.Errorf("loader: close %s: %w", s.files[s.fi], err)
		}
	}
}

// openNext opens the next file with usable columns; io.EOF after the last.
func (s *arrowSource) openNext(ctx context.Context) error {
	for {
		s.fi++
		if s.fi >= len(s.files) {
			if !s.usable {
				return fmt.Errorf("loader: %w: no file has the columns %q and %q readable (%s)%s", ErrSchema,
					s.opts.ImageColumn, s.opts.TextColumn, s.lastBad, hfColumnHint(s.files))
			}
			return io.EOF
		}
		s.root, s.path = pinFile(s.files[s.fi])
		a, err := openArrow(ctx, s.root, s.path, s.opts)
		if errors.Is(err, ErrSchema) || errors.Is(err, ErrMalformedArrow) {
			s.lastBad = err.Error()
			s.reject("", s.files[s.fi], ReasonBadArrowFile, err.Error())
			continue
		}
		if err != nil {
			return err
		}
		s.cur, s.batch, s.fileRow, s.usable, s.imgs = a, 0, 0, true, nil
		return nil
	}
}

// rejectRest quarantines what is left of a file whose next record batch
// cannot be read (one reject: the stream cannot be resumed after it).
func (s *arrowSource) rejectRest(err error) {
	reason := ReasonBadArrowFile
	if strings.Contains(err.Error(), "exceeds limit") {
		reason = ReasonTooLarge
	}
	s.reject("", s.files[s.fi]+":b"+strconv.Itoa(s.batch), reason, "rest of the file skipped: "+err.Error())
}

// entry turns the current row into an entry or a reject, and moves on.
func (s *arrowSource) entry(ctx context.Context, withImage bool) (Entry, []byte, bool) {
	row := s.row
	s.row++
	t := tableRow{file: s.files[s.fi], dir: filepath.Dir(s.path), fileRow: s.fileRow,
		loc: s.files[s.fi] + ":b" + strconv.Itoa(s.batch) + ":row" + strconv.Itoa(row),
		ref: imageRef{kind: refArrow, root: s.root, path: s.path, off: s.off, rg: int32(s.batch), row: int32(row)}}
	return s.tableEntry(ctx, s.g, row, t, &s.imgs, withImage)
}

// rowReason classifies a table row, Parquet or Arrow (a reason found earlier wins).
func rowReason(reason, detail string, hasImage, hasText bool, size int64, text string, opts Options) (string, string) {
	switch {
	case reason != "":
		return reason, detail
	case !hasImage:
		return ReasonMissingImage, "null image"
	case !hasText:
		return ReasonMissingCaption, "null text"
	case int64(len(text)) > opts.MaxCaptionBytes:
		return ReasonTooLarge, fmt.Sprintf("caption %d bytes > max %d", len(text), opts.MaxCaptionBytes)
	}
	if reason, detail = checkSize(size, opts.MaxImageBytes); reason == "" {
		reason = CheckCaption(text)
	}
	return reason, detail
}

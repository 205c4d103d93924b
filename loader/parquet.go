package loader

import (
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
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// bytesValues and stringValues cover the binary and string array types.
type bytesValues interface {
	arrow.Array
	Value(int) []byte
}

type stringValues interface {
	arrow.Array
	Value(int) string
}

// imageColumn gives row access to one row group's image column (binary or
// a struct with "bytes" and optional "path").
type imageColumn struct {
	col    *arrow.Chunked
	starts []int // first row of each chunk
	bytes  []bytesValues
	names  []stringValues // nil entries when there is no "path" field
	outer  []arrow.Array  // struct arrays (for their validity), nil for plain binary
}

// newImageColumn indexes col; it fails with ErrSchema on other types.
func newImageColumn(col *arrow.Chunked) (*imageColumn, error) {
	c := &imageColumn{col: col}
	row := 0
	for _, ch := range col.Chunks() {
		c.starts = append(c.starts, row)
		row += ch.Len()
		var b bytesValues
		var n stringValues
		var outer arrow.Array
		switch a := ch.(type) {
		case bytesValues:
			b = a
		case *array.Struct:
			outer = a
			st := a.DataType().(*arrow.StructType)
			if i, ok := st.FieldIdx("bytes"); ok {
				b, _ = a.Field(i).(bytesValues)
			}
			if i, ok := st.FieldIdx("path"); ok {
				n, _ = a.Field(i).(stringValues)
			}
		}
		if b == nil {
			return nil, fmt.Errorf("%w: image column type %s", ErrSchema, ch.DataType())
		}
		c.bytes, c.names, c.outer = append(c.bytes, b), append(c.names, n), append(c.outer, outer)
	}
	return c, nil
}

// locate maps a row to its chunk and index in the chunk.
func locate(starts []int, row int) (int, int) {
	k := 0
	for k+1 < len(starts) && starts[k+1] <= row {
		k++
	}
	return k, row - starts[k]
}

// at returns row's image bytes and name; ok is false for a null image or
// a row out of range.
func (c *imageColumn) at(row int) ([]byte, string, bool) {
	if row < 0 || row >= c.col.Len() {
		return nil, "", false
	}
	k, i := locate(c.starts, row)
	if o := c.outer[k]; o != nil && o.IsNull(i) || c.bytes[k].IsNull(i) {
		return nil, "", false
	}
	name := ""
	if n := c.names[k]; n != nil && n.IsValid(i) {
		name = baseName(n.Value(i))
	}
	return c.bytes[k].Value(i), name, true
}

func (c *imageColumn) release() { c.col.Release() }

// scalarColumn gives row access to a text or id column.
type scalarColumn struct {
	col    *arrow.Chunked
	starts []int
}

func newScalarColumn(col *arrow.Chunked, needString bool) (*scalarColumn, error) {
	c := &scalarColumn{col: col}
	row := 0
	for _, ch := range col.Chunks() {
		if _, ok := ch.(stringValues); needString && !ok {
			return nil, fmt.Errorf("%w: text column type %s", ErrSchema, ch.DataType())
		}
		c.starts = append(c.starts, row)
		row += ch.Len()
	}
	return c, nil
}

// at returns the value as a string; ok is false for null.
func (c *scalarColumn) at(row int) (string, bool) {
	k, i := locate(c.starts, row)
	ch := c.col.Chunk(k)
	if ch.IsNull(i) {
		return "", false
	}
	if s, ok := ch.(stringValues); ok {
		return s.Value(i), true
	}
	return ch.ValueStr(i), true
}

// parquetFile is one open Parquet file with its resolved columns.
type parquetFile struct {
	pf               *file.Reader
	fr               *pqarrow.FileReader
	img, text, idCol int            // top-level field indices; idCol -1 when absent
	keep             map[string]int // the kept fields' columns (parquetkeep.go)
}

// openParquet opens the Parquet file path below root (see openIn).
func openParquet(root, path string, opts Options) (*parquetFile, error) {
	f, _, err := openIn(root, path)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	pf, fr, sc, err := parquetSchema(f)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w: %w", path, ErrMalformedParquet, err)
	}
	p := &parquetFile{pf: pf, fr: fr, img: imageFieldIndex(sc, opts.ImageColumn),
		text: fieldIndex(sc, opts.TextColumn), idCol: fieldIndex(sc, opts.IDColumn)}
	if p.img < 0 || p.text < 0 {
		return nil, errors.Join(fmt.Errorf("%w: %s lacks column %q or %q (have %v)", ErrSchema, path,
			opts.ImageColumn, opts.TextColumn, sc.Fields()), pf.Close())
	}
	if err := checkTypes(sc.Field(p.img).Type, sc.Field(p.text).Type); err != nil {
		return nil, errors.Join(fmt.Errorf("loader: %s: %w", path, err), pf.Close())
	}
	p.keep = keepColumns(sc, opts.Keep)
	return p, nil
}

// imageFieldIndex finds the image column: name, else for "x.bytes" the
// struct column x (whose "bytes" field newImageColumn reads); -1 if neither.
func imageFieldIndex(sc *arrow.Schema, name string) int {
	if i := fieldIndex(sc, name); i >= 0 {
		return i
	}
	if base, ok := strings.CutSuffix(name, ".bytes"); ok {
		if i := fieldIndex(sc, base); i >= 0 && sc.Field(i).Type.ID() == arrow.STRUCT {
			return i
		}
	}
	return -1
}

// checkTypes checks the image column is binary (or a struct with a binary
// "bytes" field) and the text column a string, from the file's schema.
func checkTypes(img, text arrow.DataType) error {
	isBinary := func(t arrow.DataType) bool {
		switch t.ID() {
		case arrow.BINARY, arrow.LARGE_BINARY, arrow.BINARY_VIEW:
			return true
		}
		return false
	}
	ok := isBinary(img)
	if st, isStruct := img.(*arrow.StructType); isStruct {
		if i, has := st.FieldIdx("bytes"); has {
			ok = isBinary(st.Field(i).Type)
		}
	}
	if !ok {
		return fmt.Errorf("%w: image column type %s", ErrSchema, img)
	}
	switch text.ID() {
	case arrow.STRING, arrow.LARGE_STRING, arrow.STRING_VIEW:
		return nil
	}
	return fmt.Errorf("%w: text column type %s", ErrSchema, text)
}

// parquetSchema parses the footer and schema of f; a malformed footer that
// makes the Parquet library panic is an error, not a crash. On error f is
// closed.
func parquetSchema(f *os.File) (pf *file.Reader, fr *pqarrow.FileReader, sc *arrow.Schema, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrMalformedParquet, r)
		}
		if err != nil {
			f.Close()
		}
	}()
	if pf, err = file.NewParquetReader(f); err != nil {
		return nil, nil, nil, err
	}
	if fr, err = pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 1 << 16}, memory.DefaultAllocator); err != nil {
		return nil, nil, nil, err
	}
	if sc, err = fr.Schema(); err != nil {
		return nil, nil, nil, err
	}
	return pf, fr, sc, nil
}

// recoverTo turns a panic of the Parquet library on malformed input into an
// error wrapping ErrMalformedParquet.
func recoverTo(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v", ErrMalformedParquet, r)
	}
}

// columnBytes is the uncompressed size the footer claims for top-level
// column name in row group rg (all its leaf columns). A footer can lie low
// but not make the loader skip this check; the bound is what it claims.
func (p *parquetFile) columnBytes(rg int, name string) (_ int64, err error) {
	defer recoverTo(&err)
	if rg < 0 || rg >= p.pf.NumRowGroups() {
		return 0, fmt.Errorf("no row group %d", rg)
	}
	md := p.pf.MetaData().RowGroup(rg)
	var n int64
	for i := range md.NumColumns() {
		cc, err := md.ColumnChunk(i)
		if err != nil {
			return 0, err
		}
		if path := cc.PathInSchema(); len(path) > 0 && path[0] == name {
			n += max(cc.TotalUncompressedSize(), 0)
		}
	}
	return n, nil
}

// checkRowGroup bounds the bytes of the image, text and kept columns of rg
// before they are loaded.
func (p *parquetFile) checkRowGroup(rg int, opts Options) error {
	names := []string{opts.ImageColumn, opts.TextColumn}
	for name := range p.keep {
		names = append(names, name)
	}
	for _, name := range names {
		n, err := p.columnBytes(rg, name)
		if err != nil {
			return fmt.Errorf("%w: row group %d: %v", ErrMalformedParquet, rg, err)
		}
		if n > opts.MaxRowGroupBytes {
			return fmt.Errorf("row group %d column %q: %d bytes > max %d: %w", rg, name, n, opts.MaxRowGroupBytes, ErrTooLarge)
		}
	}
	return nil
}

func fieldIndex(sc *arrow.Schema, name string) int {
	if idx := sc.FieldIndices(name); len(idx) > 0 {
		return idx[0]
	}
	return -1
}

// readColumn reads one column of one row group.
func (p *parquetFile) readColumn(ctx context.Context, rg, col int) (_ *arrow.Chunked, err error) {
	defer recoverTo(&err)
	return p.fr.RowGroup(rg).Column(col).Read(ctx)
}

// loadImageColumn opens path (below root) and reads the image column of row group rg.
func loadImageColumn(opts Options, root, path string, rg int) (*imageColumn, error) {
	p, err := openParquet(root, path, opts)
	if err != nil {
		return nil, err
	}
	defer p.pf.Close()
	if rg >= p.pf.NumRowGroups() {
		return nil, ErrStale
	}
	if err := p.checkRowGroup(rg, opts); err != nil {
		return nil, err
	}
	col, err := p.readColumn(context.Background(), rg, p.img)
	if err != nil {
		return nil, err
	}
	ic, err := newImageColumn(col)
	if err != nil {
		col.Release()
	}
	return ic, err
}

// rowGroup holds the columns of the row group being read.
type rowGroup struct {
	img      *imageColumn
	text, id *scalarColumn
	keep     []keptColumn // Options.Keep's columns (parquetkeep.go)
	rows     int
}

func (g *rowGroup) release() {
	if g.img != nil {
		g.img.release()
	}
	for _, c := range []*scalarColumn{g.text, g.id} {
		if c != nil {
			c.col.Release()
		}
	}
	for _, k := range g.keep {
		k.col.Release()
	}
}

// parquetSource reads Parquet files row group by row group.
type parquetSource struct {
	base
	files   []string
	fi      int    // index of the open file
	root    string // the open file's folder, resolved by pinFile
	path    string // the open file, resolved by pinFile
	cur     *parquetFile
	rg      int // next row group of cur
	g       *rowGroup
	row     int         // next row of g
	fileRow int64       // row number in the file of row 0 of g
	usable  bool        // some file had a readable schema
	lastBad string      // the last file-level schema error, for the error at the end
	imgs    *imageFiles // the open file's image-path resolver, made on first use (imagepath.go)
}

func newParquetSource(files []string, opts Options) *parquetSource {
	return &parquetSource{base: base{opts: opts}, files: files, fi: -1}
}

// Next implements Source.
func (s *parquetSource) Next(ctx context.Context) (Sample, error) { return nextSample(ctx, s) }

// Close implements Source.
func (s *parquetSource) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.closeFile()
}

func (s *parquetSource) closeFile() error {
	if s.g != nil {
		s.g.release()
		s.g = nil
	}
	if s.cur == nil {
		return nil
	}
	err := s.cur.pf.Close()
	s.cur = nil
	return err
}

func (s *parquetSource) next(ctx context.Context, withImage bool) (Entry, []byte, error) {
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

// advance moves to the next row group, opening the next file when needed;
// io.EOF after the last file.
func (s *parquetSource) advance(ctx context.Context) error {
	if s.g != nil {
		s.fileRow += int64(s.g.rows)
		s.g.release()
		s.g = nil
	}
	for s.cur == nil || s.rg >= s.cur.pf.NumRowGroups() {
		if err := s.closeFile(); err != nil {
			return fmt.Errorf("loader: close %s: %w", s.files[s.fi], err)
		}
		s.fi++
		if s.fi >= len(s.files) {
			if !s.usable {
				return fmt.Errorf("loader: %w: no file has the columns %q and %q readable (%s)", ErrSchema, s.opts.ImageColumn, s.opts.TextColumn, s.lastBad)
			}
			return io.EOF
		}
		s.root, s.path = pinFile(s.files[s.fi])
		p, err := openParquet(s.root, s.path, s.opts)
		if errors.Is(err, ErrSchema) || errors.Is(err, ErrMalformedParquet) {
			s.rejectFile(err)
			continue
		}
		if err != nil {
			return err
		}
		s.cur, s.rg, s.fileRow, s.usable, s.imgs = p, 0, 0, true, nil
	}
	rg := s.rg
	s.rg++
	g, err := s.readRowGroup(ctx, rg)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.rejectRowGroup(rg, err)
		return nil
	}
	s.g, s.row = g, 0
	return nil
}

func (s *parquetSource) readRowGroup(ctx context.Context, rg int) (*rowGroup, error) {
	if err := s.cur.checkRowGroup(rg, s.opts); err != nil {
		return nil, err
	}
	g := &rowGroup{}
	col, err := s.cur.readColumn(ctx, rg, s.cur.img)
	if err == nil {
		g.img, err = newImageColumn(col)
		if err != nil {
			col.Release()
		}
	}
	if err == nil {
		col, err = s.cur.readColumn(ctx, rg, s.cur.text)
		if err == nil {
			g.text, err = newScalarColumn(col, true)
		}
	}
	if err == nil && s.cur.idCol >= 0 {
		col, err = s.cur.readColumn(ctx, rg, s.cur.idCol)
		if err == nil {
			g.id, _ = newScalarColumn(col, false)
		}
	}
	if err == nil {
		err = s.readKeep(ctx, g, rg)
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

// checkLengths makes sure every column has as many rows as the image column:
// the rows are counted from the data read, never from the footer's claim.
func (g *rowGroup) checkLengths() error {
	n := g.img.col.Len()
	for _, c := range []*scalarColumn{g.text, g.id} {
		if c != nil && c.col.Len() != n {
			return fmt.Errorf("%w: columns hold %d and %d rows", ErrMalformedParquet, n, c.col.Len())
		}
	}
	for _, k := range g.keep {
		if k.col.Len() != n {
			return fmt.Errorf("%w: columns hold %d and %d rows", ErrMalformedParquet, n, k.col.Len())
		}
	}
	return nil
}

// rejectRowGroup quarantines an unreadable (or too large) row group with
// one reject: the row count its footer claims is not trusted to size a loop
// (it is only named in the detail, and keeps later derived ids stable).
func (s *parquetSource) rejectRowGroup(rg int, err error) {
	n := s.cur.pf.MetaData().RowGroups[rg].GetNumRows()
	reason := ReasonBadParquetRow
	if errors.Is(err, ErrTooLarge) {
		reason = ReasonTooLarge
	}
	s.reject("", s.files[s.fi]+":rg"+strconv.Itoa(rg), reason, fmt.Sprintf("row group claims %d rows: %v", n, err))
	s.fileRow += min(max(n, 0), 1<<40)
}

// rejectFile quarantines a whole file whose schema cannot be read (one
// reject for the file).
func (s *parquetSource) rejectFile(err error) {
	s.lastBad = err.Error()
	s.reject("", s.files[s.fi], ReasonBadParquetFile, err.Error())
}

func (s *parquetSource) loc(rg, row int) string {
	return s.files[s.fi] + ":rg" + strconv.Itoa(rg) + ":row" + strconv.Itoa(row)
}

// entry turns the current row into an entry or a reject, and moves on.
func (s *parquetSource) entry(ctx context.Context, withImage bool) (Entry, []byte, bool) {
	row, rg := s.row, s.rg-1
	s.row++
	t := tableRow{file: s.files[s.fi], dir: filepath.Dir(s.path), loc: s.loc(rg, row), fileRow: s.fileRow,
		ref: imageRef{kind: refParquet, root: s.root, path: s.path, rg: int32(rg), row: int32(row)}}
	return s.tableEntry(ctx, s.g, row, t, &s.imgs, withImage)
}

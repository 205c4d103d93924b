package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	img, text, idCol int // top-level field indices; idCol -1 when absent
}

func openParquet(path string, opts Options) (*parquetFile, error) {
	pf, err := file.OpenParquetFile(path, false)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{BatchSize: 1 << 16}, memory.DefaultAllocator)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("loader: open %s: %w", path, err), pf.Close())
	}
	sc, err := fr.Schema()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("loader: schema %s: %w", path, err), pf.Close())
	}
	p := &parquetFile{pf: pf, fr: fr, img: imageFieldIndex(sc, opts.ImageColumn),
		text: fieldIndex(sc, opts.TextColumn), idCol: fieldIndex(sc, opts.IDColumn)}
	if p.img < 0 || p.text < 0 {
		return nil, errors.Join(fmt.Errorf("%w: %s lacks column %q or %q (have %v)", ErrSchema, path,
			opts.ImageColumn, opts.TextColumn, sc.Fields()), pf.Close())
	}
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

func fieldIndex(sc *arrow.Schema, name string) int {
	if idx := sc.FieldIndices(name); len(idx) > 0 {
		return idx[0]
	}
	return -1
}

// readColumn reads one column of one row group.
func (p *parquetFile) readColumn(ctx context.Context, rg, col int) (*arrow.Chunked, error) {
	return p.fr.RowGroup(rg).Column(col).Read(ctx)
}

// loadImageColumn opens path and reads the image column of row group rg.
func loadImageColumn(opts Options, path string, rg int) (*imageColumn, error) {
	p, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	defer p.pf.Close()
	if rg >= p.pf.NumRowGroups() {
		return nil, ErrStale
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
}

// parquetSource reads Parquet files row group by row group.
type parquetSource struct {
	base
	files   []string
	fi      int // index of the open file
	cur     *parquetFile
	rg      int // next row group of cur
	g       *rowGroup
	row     int   // next row of g
	fileRow int64 // row number in the file of row 0 of g
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
		if e, img, ok := s.entry(withImage); ok {
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
			return io.EOF
		}
		p, err := openParquet(s.files[s.fi], s.opts)
		if err != nil {
			return err
		}
		s.cur, s.rg, s.fileRow = p, 0, 0
	}
	rg := s.rg
	s.rg++
	g, err := s.readRowGroup(ctx, rg)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrSchema) {
			return fmt.Errorf("loader: %s: %w", s.files[s.fi], err)
		}
		s.rejectRowGroup(rg, err)
		return nil
	}
	s.g, s.row = g, 0
	return nil
}

func (s *parquetSource) readRowGroup(ctx context.Context, rg int) (*rowGroup, error) {
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
	if err != nil {
		g.release()
		return nil, err
	}
	g.rows = g.img.col.Len()
	return g, nil
}

// rejectRowGroup quarantines every row of an unreadable row group.
func (s *parquetSource) rejectRowGroup(rg int, err error) {
	n := s.cur.pf.MetaData().RowGroups[rg].GetNumRows()
	for r := range n {
		s.reject("", s.loc(rg, int(r)), ReasonBadParquetRow, err.Error())
	}
	s.fileRow += n
}

func (s *parquetSource) loc(rg, row int) string {
	return s.files[s.fi] + ":rg" + strconv.Itoa(rg) + ":row" + strconv.Itoa(row)
}

// entry turns the current row into an entry or a reject, and moves on.
func (s *parquetSource) entry(withImage bool) (Entry, []byte, bool) {
	row, rg := s.row, s.rg-1
	s.row++
	loc := s.loc(rg, row)
	id := ""
	if s.g.id != nil {
		id, _ = s.g.id.at(row)
	}
	if id == "" {
		id = DeriveID(filepath.Base(s.files[s.fi]), "row"+strconv.FormatInt(s.fileRow+int64(row), 10))
	}
	img, name, ok := s.g.img.at(row)
	text, hasText := s.g.text.at(row)
	reason, detail := "", ""
	switch {
	case !ok:
		reason, detail = ReasonMissingImage, "null image"
	case !hasText:
		reason, detail = ReasonMissingCaption, "null text"
	default:
		if reason, detail = checkSize(int64(len(img)), s.opts.MaxImageBytes); reason == "" {
			reason = CheckCaption(text)
		}
	}
	if reason != "" {
		s.reject(id, loc, reason, detail)
		return Entry{}, nil, false
	}
	e := Entry{ID: id, Location: loc, Text: text, ImageName: name, ImageSize: int64(len(img)),
		ref: imageRef{kind: refParquet, path: s.files[s.fi], rg: int32(rg), row: int32(row)}}
	if !withImage {
		return e, nil, true
	}
	return e, append([]byte(nil), img...), true
}

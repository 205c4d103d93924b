package loader

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
)

// Kept fields of a Parquet row or an Arrow (HF save_to_disk) row
// (Options.Keep): a bare name is a top-level
// column, json:a.b a path into the top-level struct (or map) column a. The
// row's kept columns are turned into one JSON object, {column: value} (as
// arrow-go marshals a value: structs as objects, lists as arrays), which
// extractKeep then reads as it reads a manifest line. A column the file
// lacks gives missing values.

// keepColumns returns the top-level columns of sc the kept fields name
// (each once), by field index.
func keepColumns(sc *arrow.Schema, fields []KeepField) map[string]int {
	out := map[string]int{}
	for _, f := range fields {
		name := f.Path
		if f.Kind == KeepPath {
			name, _, _ = strings.Cut(f.Path, ".")
		}
		if f.Kind == KeepCaption || name == "" {
			continue
		}
		if i := fieldIndex(sc, name); i >= 0 {
			out[name] = i
		}
	}
	return out
}

// keptColumn is one kept column of a row group.
type keptColumn struct {
	name   string
	col    *arrow.Chunked
	starts []int
}

// readKeep reads the row group's kept columns into g.
func (s *parquetSource) readKeep(ctx context.Context, g *rowGroup, rg int) error {
	for name, idx := range s.cur.keep {
		col, err := s.cur.readColumn(ctx, rg, idx)
		if err != nil {
			return err
		}
		g.keep = append(g.keep, newKeptColumn(name, col))
	}
	return nil
}

// newKeptColumn is the kept column name of col (which it takes over).
func newKeptColumn(name string, col *arrow.Chunked) keptColumn {
	k := keptColumn{name: name, col: col}
	row := 0
	for _, ch := range col.Chunks() {
		k.starts = append(k.starts, row)
		row += ch.Len()
	}
	return k
}

// rowJSON is row's kept columns as a JSON object (nil without kept columns,
// and when a value cannot be read: its fields are missing).
func (g *rowGroup) rowJSON(row int) (out []byte) {
	if len(g.keep) == 0 {
		return nil
	}
	defer func() { // a hostile nested value arrow-go's accessors cannot read
		if recover() != nil {
			out = nil
		}
	}()
	obj := make(map[string]any, len(g.keep))
	for _, k := range g.keep {
		c, i := locate(k.starts, row)
		ch := k.col.Chunk(c)
		if ch.IsNull(i) {
			continue
		}
		obj[k.name] = ch.GetOneForMarshal(i)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil // a value arrow-go cannot marshal: its fields are missing
	}
	return b
}

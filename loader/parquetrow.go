package loader

import (
	"context"
	"path/filepath"
	"strconv"
)

// A Parquet row group and an Arrow record batch are read into the same
// rowGroup (image, text, id and kept columns), and their rows become
// entries by the same code: tableEntry.

// tableRow says where a row of a rowGroup is: its file as listed, the
// resolved folder of the open file (where a path-only image is looked up),
// its location, the file's row number of the group's row 0, and the
// reference of an image stored in the table.
type tableRow struct {
	file, dir, loc string
	fileRow        int64
	ref            imageRef
}

// tableEntry turns row of g into an entry or a reject: the id column (else
// an id derived from the file and the row number), the image (its bytes, or
// a path-only image resolved through *imgs, made on first use), the caption
// and the kept fields' JSON object (b.json, for Scan).
func (b *base) tableEntry(ctx context.Context, g *rowGroup, row int, t tableRow, imgs **imageFiles, withImage bool) (Entry, []byte, bool) {
	id := ""
	if g.id != nil {
		id, _ = g.id.at(row)
	}
	if id == "" {
		id = DeriveID(filepath.Base(t.file), "row"+strconv.FormatInt(t.fileRow+int64(row), 10))
	}
	img, name, ok := g.img.at(row)
	size, ref := int64(len(img)), t.ref
	reason, detail := "", ""
	if p, isPath := g.img.pathOnly(row); isPath { // a local file, as HF to_parquet and save_to_disk keep it
		if *imgs == nil {
			*imgs = newImageFiles(b.opts, t.dir)
		}
		ref, size, reason, detail = (*imgs).resolve(p, b.opts)
		name, ok = baseName(p), true
	}
	text, hasText := g.text.at(row)
	reason, detail = rowReason(reason, detail, ok, hasText, size, text, b.opts)
	if reason != "" {
		b.reject(id, t.loc, reason, detail)
		return Entry{}, nil, false
	}
	e := Entry{ID: id, Location: t.loc, Text: text, ImageName: name, ImageSize: size, ref: ref}
	b.json = g.rowJSON(row) // the kept fields' object (Scan reads it before the next row)
	switch {
	case !withImage:
		return e, nil, true
	case ref.kind == refFile:
		return b.readImageFile(ctx, e)
	}
	return e, append([]byte(nil), img...), true
}

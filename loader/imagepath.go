package loader

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// A table row (Parquet, Arrow) whose image struct holds a "path" and no
// "bytes" names an image file, as HuggingFace datasets write an Image column
// built from local files (Dataset.to_parquet keeps the path, often
// absolute). The file is read under the manifest's no-escape rules: the
// root is Options.Root, else the table file's folder; a relative path may
// not leave it (lexically or through a link), an absolute one must lie
// below it once its links are resolved (unless Options.AllowAbsolute, which
// opens it as given), and every open goes through openIn below the resolved
// root, so a file swapped later for a link that leaves it is refused.

// imageFiles resolves the image paths of one table file's rows.
type imageFiles struct {
	root     string // the root relative paths join, absolute
	realRoot string // root with its links resolved ("" when err is set)
	err      error  // why the root cannot be used
}

// newImageFiles returns the resolver of the rows of the table file whose
// resolved folder is dir.
func newImageFiles(opts Options, dir string) *imageFiles {
	root := dir
	if opts.Root != "" {
		root = opts.Root
	}
	f := &imageFiles{}
	if f.root, f.err = filepath.Abs(root); f.err == nil {
		f.realRoot, f.err = filepath.EvalSymlinks(f.root)
	}
	return f
}

// resolve returns where to open the image file p (a reference of kind
// refFile) and its size, or a reject reason and detail.
func (f *imageFiles) resolve(p string, opts Options) (imageRef, int64, string, string) {
	if filepath.IsAbs(p) && opts.AllowAbsolute {
		fi, err := os.Stat(p)
		full, size, reason, detail := statResult(filepath.Clean(p), p, fi, err)
		return imageRef{kind: refFile, path: full}, size, reason, detail
	}
	if f.err != nil {
		return imageRef{}, 0, ReasonMissingImage, "image root: " + f.err.Error()
	}
	full := p
	if !filepath.IsAbs(p) {
		if !filepath.IsLocal(filepath.FromSlash(p)) {
			return imageRef{}, 0, ReasonEscapesRoot, "image path leaves " + f.root + ": " + p
		}
		full = filepath.Join(f.root, filepath.FromSlash(p))
	}
	real, err := filepath.EvalSymlinks(full)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return imageRef{}, 0, ReasonMissingImage, "image file not found: " + full
	case err != nil:
		return imageRef{}, 0, ReasonUnreadableImage, err.Error()
	case !below(f.realRoot, real):
		return imageRef{}, 0, ReasonEscapesRoot, "image path " + p + " is not below " + f.root +
			" (set --root to a folder that holds the images, or --allow-absolute-paths)"
	}
	fi, err := os.Stat(real)
	real, size, reason, detail := statResult(real, p, fi, err)
	rel, _ := filepath.Rel(f.realRoot, real)
	return imageRef{kind: refFile, root: f.realRoot, path: rel}, size, reason, detail
}

// below reports whether the resolved path real is realRoot or inside it
// (also for the root "/", which within does not take).
func below(realRoot, real string) bool {
	rel, err := filepath.Rel(realRoot, real)
	return err == nil && (rel == "." || filepath.IsLocal(rel))
}

// fileImage reads the bytes of a row's image file (see resolve).
func fileImage(ctx context.Context, e Entry) ([]byte, error) {
	return readFileRange(ctx, e, 0, e.ImageSize, true)
}

// pathOnly returns row's image path when its struct holds a non-empty path
// and null bytes; ok is false otherwise.
func (c *imageColumn) pathOnly(row int) (string, bool) {
	if row < 0 || row >= c.col.Len() {
		return "", false
	}
	k, i := locate(c.starts, row)
	o, n := c.outer[k], c.names[k]
	if o == nil || n == nil || o.IsNull(i) || !c.bytes[k].IsNull(i) || n.IsNull(i) || n.Value(i) == "" {
		return "", false
	}
	return n.Value(i), true
}

// readImageFile reads the image file of e, a row that names one, rejecting
// the row when the read fails.
func (b *base) readImageFile(ctx context.Context, e Entry) (Entry, []byte, bool) {
	img, err := fileImage(ctx, e)
	if err != nil {
		b.reject(e.ID, e.Location, readReason(err), err.Error())
		return Entry{}, nil, false
	}
	return e, img, true
}

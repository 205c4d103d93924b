package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// folderItem is one image (or an orphan caption) of an image folder.
type folderItem struct {
	rel     string      // image (or orphan caption) path relative to the folder, slash-separated
	caption string      // sidecar path relative to the folder, "" when absent
	orphan  bool        // a caption without an image
	meta    *folderMeta // the image's metadata row (folder_meta.go), nil when none
}

// folderSource reads images with sidecar captions below a folder. The
// sidecar of "a/cat.jpg" is "a/cat.txt" (the extension after the last dot is
// replaced). A .txt without any image is quarantined as "missing_image".
// An image with a row in a metadata.jsonl or metadata.csv (HF imagefolder,
// folder_meta.go) takes its caption and kept fields from that row instead.
// Images and captions must be regular files inside the folder: a symbolic
// link is followed only when its target stays inside (else "escapes_root"),
// and a named pipe, device or socket is quarantined as "not_regular_file"
// without being opened for a blocking read.
type folderSource struct {
	base
	dir      string
	realRoot string // dir with symbolic links resolved
	items    []folderItem
	i        int
}

func openFolder(dir string, opts Options) (*folderSource, error) {
	realRoot, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", dir, err)
	}
	if realRoot, err = filepath.Abs(realRoot); err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", dir, err)
	}
	items, metas, err := listFolder(dir)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: no images or captions under %s", ErrNoData, dir)
	}
	s := &folderSource{base: base{opts: opts}, dir: dir, realRoot: realRoot, items: items}
	if len(metas) > 0 {
		s.attachMetadata(metas)
	}
	return s, nil
}

// attachMetadata reads the metadata files and gives each listed image its row.
func (s *folderSource) attachMetadata(metas []string) {
	images := make(map[string]bool, len(s.items))
	for _, it := range s.items {
		if !it.orphan {
			images[it.rel] = true
		}
	}
	rows := s.readMetadata(metas, images)
	for i := range s.items {
		s.items[i].meta = rows[s.items[i].rel]
	}
}

// listFolder walks dir in lexical order and pairs images with captions;
// it returns the metadata files too (folder_meta.go), in walk order.
// Every non-directory entry with an image or .txt extension is listed
// (pipes, devices and links too: they are checked, and quarantined, when
// read). The walk does not descend into linked directories.
func listFolder(dir string) ([]folderItem, []string, error) {
	var images, metas []string
	captions := map[string]bool{} // stem → has .txt
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		ext := filepath.Ext(rel)
		switch {
		case isImageExt(ext):
			images = append(images, rel)
		case isFolderMetadata(rel):
			metas = append(metas, rel)
		case strings.EqualFold(ext, ".txt"):
			captions[strings.TrimSuffix(rel, ext)] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("loader: list %s: %w", dir, err)
	}
	return pairFolder(images, captions), metas, nil
}

// pairFolder matches images (in walk order) with their sidecars and appends
// orphan captions in walk order of their stems.
func pairFolder(images []string, captions map[string]bool) []folderItem {
	items := make([]folderItem, 0, len(images))
	used := map[string]bool{}
	for _, rel := range images {
		stem := strings.TrimSuffix(rel, filepath.Ext(rel))
		it := folderItem{rel: rel}
		if captions[stem] {
			it.caption, used[stem] = stem+".txt", true
		}
		items = append(items, it)
	}
	var orphans []folderItem
	for stem := range captions {
		if !used[stem] {
			orphans = append(orphans, folderItem{rel: stem + ".txt", orphan: true})
		}
	}
	sortItems(orphans)
	return append(items, orphans...)
}

func sortItems(items []folderItem) {
	slices.SortFunc(items, func(a, b folderItem) int { return strings.Compare(a.rel, b.rel) })
}

// Next implements Source.
func (s *folderSource) Next(ctx context.Context) (Sample, error) { return nextSample(ctx, s) }

// Close implements Source.
func (s *folderSource) Close() error {
	s.closed = true
	return nil
}

func (s *folderSource) next(ctx context.Context, withImage bool) (Entry, []byte, error) {
	if s.closed {
		return Entry{}, nil, ErrClosed
	}
	for s.i < len(s.items) {
		if err := ctx.Err(); err != nil {
			return Entry{}, nil, err
		}
		it := s.items[s.i]
		s.i++
		if e, img, ok := s.entry(ctx, it, withImage); ok {
			s.tally.Emit()
			return e, img, nil
		}
		if err := ctx.Err(); err != nil { // a read cut short by ctx is no reject
			return Entry{}, nil, err
		}
	}
	return Entry{}, nil, io.EOF
}

func (s *folderSource) entry(ctx context.Context, it folderItem, withImage bool) (Entry, []byte, bool) {
	loc := filepath.Join(s.dir, filepath.FromSlash(it.rel))
	if it.orphan {
		s.reject(strings.TrimSuffix(it.rel, ".txt"), loc, ReasonMissingImage, "caption without image")
		return Entry{}, nil, false
	}
	text, reason, detail := s.captionOf(ctx, it)
	if reason == "" {
		reason = CheckCaption(text)
	}
	var size int64
	var real string
	if reason == "" {
		real, size, reason, detail = s.statImage(it.rel)
	}
	if reason != "" {
		if ctx.Err() == nil {
			s.reject(it.rel, loc, reason, detail)
		}
		return Entry{}, nil, false
	}
	e := Entry{ID: it.rel, Location: loc, Text: text, ImageName: filepath.Base(loc),
		ImageSize: size, ref: imageRef{kind: refFile, root: s.realRoot, path: real}}
	if !withImage {
		return e, nil, true
	}
	img, err := readFileRange(ctx, e, 0, size, true)
	if err != nil {
		if ctx.Err() == nil {
			s.reject(it.rel, loc, readReason(err), err.Error())
		}
		return Entry{}, nil, false
	}
	return e, img, true
}

// captionOf is the caption of it: its metadata row's (whose JSON object it
// leaves in s.json for the kept fields), else its sidecar's.
func (s *folderSource) captionOf(ctx context.Context, it folderItem) (string, string, string) {
	s.json = nil
	if it.meta == nil {
		return s.caption(ctx, it)
	}
	s.json = it.meta.json // Scan reads it before the next entry
	switch m := it.meta; {
	case !m.hasText:
		return "", ReasonMissingCaption, "metadata row without " + s.opts.TextColumn
	case int64(len(m.text)) > s.opts.MaxCaptionBytes:
		return "", ReasonTooLarge, fmt.Sprintf("caption %d bytes > max %d", len(m.text), s.opts.MaxCaptionBytes)
	}
	return it.meta.text, "", ""
}

// caption reads the sidecar caption of it: a regular file inside the folder
// of at most MaxCaptionBytes, read without blocking on pipes or devices.
func (s *folderSource) caption(ctx context.Context, it folderItem) (string, string, string) {
	if it.caption == "" {
		return "", ReasonMissingCaption, "no sidecar .txt"
	}
	p, reason, detail := s.inside(it.caption)
	if reason != "" {
		if reason == ReasonMissingImage {
			reason = ReasonMissingCaption
		}
		return "", reason, "caption: " + detail
	}
	data, err := readFileBounded(ctx, s.realRoot, p, s.opts.MaxCaptionBytes)
	if err != nil {
		reason := readReason(err)
		if reason == ReasonMissingImage || reason == ReasonUnreadableImage {
			reason = ReasonMissingCaption
		}
		return "", reason, "caption: " + err.Error()
	}
	return string(data), "", ""
}

// inside resolves the slash-separated path rel below the folder when it is a
// symbolic link and checks the target stays inside the folder; it returns
// the path to open, below the resolved folder (s.realRoot).
func (s *folderSource) inside(rel string) (string, string, string) {
	p := filepath.Join(s.realRoot, filepath.FromSlash(rel))
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", ReasonMissingImage, err.Error()
	case err != nil:
		return "", ReasonUnreadableImage, err.Error()
	case fi.Mode()&fs.ModeSymlink != 0:
		return resolveInside(s.realRoot, p)
	case !fi.Mode().IsRegular():
		return "", ReasonNotRegular, kindOf(fi.Mode())
	}
	return p, "", ""
}

// statImage checks an image path (slash-separated, relative to the folder):
// inside the folder, regular, of an accepted size. It returns the path to
// open and the size.
func (s *folderSource) statImage(rel string) (string, int64, string, string) {
	real, reason, detail := s.inside(rel)
	if reason != "" {
		return "", 0, reason, detail
	}
	fi, err := os.Stat(real)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", 0, ReasonMissingImage, err.Error()
	case err != nil:
		return "", 0, ReasonUnreadableImage, err.Error()
	case !fi.Mode().IsRegular():
		return "", 0, ReasonNotRegular, kindOf(fi.Mode())
	}
	reason, detail = checkSize(fi.Size(), s.opts.MaxImageBytes)
	return real, fi.Size(), reason, detail
}

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
	rel     string // image (or orphan caption) path relative to the folder, slash-separated
	caption string // sidecar path relative to the folder, "" when absent
	orphan  bool   // a caption without an image
}

// folderSource reads images with sidecar captions below a folder. The
// sidecar of "a/cat.jpg" is "a/cat.txt" (the extension after the last dot is
// replaced). A .txt without any image is quarantined as "missing_image".
type folderSource struct {
	base
	dir   string
	items []folderItem
	i     int
}

func openFolder(dir string, opts Options) (*folderSource, error) {
	items, err := listFolder(dir)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: no images or captions under %s", ErrNoData, dir)
	}
	return &folderSource{base: base{opts: opts}, dir: dir, items: items}, nil
}

// listFolder walks dir in lexical order and pairs images with captions.
func listFolder(dir string) ([]folderItem, error) {
	var images []string
	captions := map[string]bool{} // stem → has .txt
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !(d.Type().IsRegular() || d.Type()&fs.ModeSymlink != 0) {
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
		case strings.EqualFold(ext, ".txt"):
			captions[strings.TrimSuffix(rel, ext)] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loader: list %s: %w", dir, err)
	}
	return pairFolder(images, captions), nil
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
		if e, img, ok := s.entry(it, withImage); ok {
			s.tally.Emit()
			return e, img, nil
		}
	}
	return Entry{}, nil, io.EOF
}

func (s *folderSource) entry(it folderItem, withImage bool) (Entry, []byte, bool) {
	loc := filepath.Join(s.dir, filepath.FromSlash(it.rel))
	if it.orphan {
		s.reject(strings.TrimSuffix(it.rel, ".txt"), loc, ReasonMissingImage, "caption without image")
		return Entry{}, nil, false
	}
	text, reason, detail := s.caption(it)
	if reason == "" {
		reason = CheckCaption(text)
	}
	var size int64
	if reason == "" {
		size, reason, detail = statImage(loc, s.opts.MaxImageBytes)
	}
	if reason != "" {
		s.reject(it.rel, loc, reason, detail)
		return Entry{}, nil, false
	}
	e := Entry{ID: it.rel, Location: loc, Text: text, ImageName: filepath.Base(loc),
		ImageSize: size, ref: imageRef{kind: refFile, path: loc}}
	if !withImage {
		return e, nil, true
	}
	img, err := readFileRange(e, 0, size, true)
	if err != nil {
		s.reject(it.rel, loc, ReasonUnreadableImage, err.Error())
		return Entry{}, nil, false
	}
	return e, img, true
}

// caption reads the sidecar caption of it.
func (s *folderSource) caption(it folderItem) (string, string, string) {
	if it.caption == "" {
		return "", ReasonMissingCaption, "no sidecar .txt"
	}
	p := filepath.Join(s.dir, filepath.FromSlash(it.caption))
	fi, err := os.Stat(p)
	if err == nil && fi.Size() > s.opts.MaxCaptionBytes {
		return "", ReasonTooLarge, fmt.Sprintf("caption %d bytes > max %d", fi.Size(), s.opts.MaxCaptionBytes)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return "", ReasonMissingCaption, err.Error()
	}
	return string(data), "", ""
}

// statImage returns the size of a regular image file, or a reject reason.
func statImage(p string, max int64) (int64, string, string) {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, ReasonMissingImage, err.Error()
	case err != nil:
		return 0, ReasonUnreadableImage, err.Error()
	case !fi.Mode().IsRegular():
		return 0, ReasonUnreadableImage, "not a regular file"
	}
	reason, detail := checkSize(fi.Size(), max)
	return fi.Size(), reason, detail
}

package loader

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// An image folder in the HF imagefolder layout
// (https://huggingface.co/docs/datasets/image_dataset#imagefolder) holds
// metadata.jsonl or metadata.csv files (in its root or any subfolder) beside
// the images: one JSON object per line, or one CSV row under a header of
// column names, whose "file_name" names an image relative to the metadata
// file's folder. That row gives the image its caption (Options.TextColumn,
// "text" by default, where "caption" stands in for an absent "text" as in a
// manifest) and the columns --keep reads (the row's JSON object; a CSV row's
// values are strings). An image without a row keeps its sidecar .txt. Bad
// rows are quarantined: a line that is not a JSON object, or a CSV record
// that does not parse, as "bad_manifest_line"; a file_name that is missing,
// absolute or leaves the folder as "bad_manifest_line" or "escapes_root"; a
// row of an image the folder does not hold as "missing_image"; a second row
// of an image as "duplicate_id". A metadata line is bounded as a manifest
// line is (MaxCaptionBytes + 64 KiB): a longer one skips the rest of its file.

// Metadata file names of the HF imagefolder layout.
const (
	FolderMetadataJSONL = "metadata.jsonl"
	FolderMetadataCSV   = "metadata.csv"
)

// folderMeta is an image's metadata row.
type folderMeta struct {
	text    string
	hasText bool
	json    []byte // the row as a JSON object, for the kept fields
}

// isFolderMetadata reports whether a slash-separated path names a metadata file.
func isFolderMetadata(rel string) bool {
	b := path.Base(rel)
	return strings.EqualFold(b, FolderMetadataJSONL) || strings.EqualFold(b, FolderMetadataCSV)
}

// readMetadata reads the metadata files (slash-separated, relative to the
// folder) into rows by image path; images is the set of listed images.
func (s *folderSource) readMetadata(files []string, images map[string]bool) map[string]*folderMeta {
	out := map[string]*folderMeta{}
	for _, rel := range files {
		s.readMetadataFile(rel, images, out)
	}
	return out
}

func (s *folderSource) readMetadataFile(rel string, images map[string]bool, out map[string]*folderMeta) {
	loc := s.dir + "/" + rel
	p, reason, detail := s.inside(rel)
	if reason != "" {
		s.reject(rel, loc, reason, "metadata: "+detail)
		return
	}
	f, _, err := openIn(s.realRoot, p) // regular, inside, never a blocking read
	if err != nil {
		s.reject(rel, loc, readReason(err), "metadata: "+err.Error())
		return
	}
	defer f.Close()
	add := func(line int, row map[string]json.RawMessage) {
		s.addMetaRow(path.Dir(rel), loc+":"+strconv.Itoa(line), row, images, out)
	}
	if strings.EqualFold(path.Base(rel), FolderMetadataCSV) {
		s.readMetaCSV(f, loc, add)
		return
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), int(s.maxMetaLine()))
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var row map[string]json.RawMessage
		if line[0] != '{' || json.Unmarshal(line, &row) != nil {
			s.reject("", loc+":"+strconv.Itoa(n), ReasonBadManifestLine, "metadata line is not a JSON object")
			continue
		}
		add(n, row)
	}
	if err := sc.Err(); err != nil {
		s.reject("", loc, metaReason(err), "rest of the metadata skipped: "+err.Error())
	}
}

// readMetaCSV reads a metadata.csv: a header of column names, then rows.
func (s *folderSource) readMetaCSV(f io.Reader, loc string, add func(int, map[string]json.RawMessage)) {
	r := csv.NewReader(&boundedLines{r: bufio.NewReader(f), max: s.maxMetaLine()})
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if err != nil {
		s.reject("", loc, metaReason(err), "metadata header: "+err.Error())
		return
	}
	for n := 2; ; n++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		var pe *csv.ParseError
		if errors.As(err, &pe) && len(rec) == 0 {
			s.reject("", loc+":"+strconv.Itoa(n), ReasonBadManifestLine, err.Error())
			continue
		}
		if err != nil {
			s.reject("", loc, metaReason(err), "rest of the metadata skipped: "+err.Error())
			return
		}
		row := make(map[string]json.RawMessage, len(header))
		for i, name := range header {
			if i < len(rec) {
				row[name], _ = json.Marshal(rec[i]) // a string: cannot fail
			}
		}
		add(n, row)
	}
}

// addMetaRow records one metadata row of the folder dir (slash-separated,
// relative to the image folder; "." for its root).
func (s *folderSource) addMetaRow(dir, loc string, row map[string]json.RawMessage, images map[string]bool, out map[string]*folderMeta) {
	name, ok := jsonScalar(row["file_name"])
	if !ok || name == "" {
		s.reject("", loc, ReasonBadManifestLine, "metadata row without a file_name string")
		return
	}
	rel := path.Clean(path.Join(dir, strings.ReplaceAll(name, "\\", "/")))
	if path.IsAbs(name) || rel == ".." || strings.HasPrefix(rel, "../") {
		s.reject(name, loc, ReasonEscapesRoot, "metadata file_name "+strconv.Quote(name)+" leaves the folder")
		return
	}
	switch {
	case !images[rel]:
		s.reject(rel, loc, ReasonMissingImage, "metadata file_name "+strconv.Quote(name)+": no such image in the folder")
		return
	case out[rel] != nil:
		s.reject(rel, loc, ReasonDuplicateID, "a second metadata row of "+rel)
		return
	}
	m := &folderMeta{}
	text := lookupPath(row, s.opts.TextColumn)
	if text == nil && s.opts.TextColumn == DefaultOptions().TextColumn {
		text = row["caption"]
	}
	m.text, m.hasText = jsonScalar(text)
	m.hasText = m.hasText && !isNull(text)
	m.json, _ = json.Marshal(row) // raw values of a parsed object: cannot fail
	out[rel] = m
}

// maxMetaLine bounds a metadata line as a manifest line is bounded.
func (s *folderSource) maxMetaLine() int64 { return s.opts.MaxCaptionBytes + 64<<10 }

func metaReason(err error) string {
	if errors.Is(err, bufio.ErrTooLong) {
		return ReasonTooLarge
	}
	return ReasonBadManifestLine
}

// boundedLines passes lines of at most max bytes and fails with
// bufio.ErrTooLong on a longer one (a CSV reader buffers a whole record).
type boundedLines struct {
	r    *bufio.Reader
	max  int64
	line int64 // bytes of the current line so far
}

func (b *boundedLines) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	for _, c := range p[:n] {
		if c == '\n' {
			b.line = 0
		} else if b.line++; b.line > b.max {
			return 0, fmt.Errorf("metadata line over %d bytes: %w", b.max, bufio.ErrTooLong)
		}
	}
	return n, err
}

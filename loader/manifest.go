package loader

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// manifestLine is one parsed manifest line.
type manifestLine struct {
	Image string
	Text  string
	ID    string
}

// rawManifestLine keeps the fields raw so their types can be checked.
type rawManifestLine struct {
	Image   json.RawMessage `json:"image"`
	Text    json.RawMessage `json:"text"`
	Caption json.RawMessage `json:"caption"`
	ID      json.RawMessage `json:"id"`
}

// manifestFields names the fields of a manifest line, each a key or a dotted
// path into nested objects ("image.path").
type manifestFields struct{ image, text, id string }

// isDefault reports the default names, read by the faster fixed-struct path.
func (f manifestFields) isDefault() bool {
	return f == manifestFields{} || f == manifestFields{"image", "text", "id"}
}

// parseManifestLine parses one manifest line with the default field names.
// On failure it returns a reject reason and detail. "caption" is accepted
// when "text" is absent; "id" may be a string or a number.
func parseManifestLine(line []byte) (manifestLine, string, string) {
	return parseManifestFields(line, manifestFields{})
}

// parseManifestFields parses one manifest line whose fields are named by f
// ("caption" stands in for an absent text only under the default names).
func parseManifestFields(line []byte, f manifestFields) (manifestLine, string, string) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return manifestLine{}, ReasonBadManifestLine, "not a JSON object"
	}
	var raw rawManifestLine
	if f.isDefault() {
		if err := json.Unmarshal(line, &raw); err != nil {
			return manifestLine{}, ReasonBadManifestLine, err.Error()
		}
	} else {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(line, &obj); err != nil {
			return manifestLine{}, ReasonBadManifestLine, err.Error()
		}
		raw = rawManifestLine{Image: lookupPath(obj, f.image), Text: lookupPath(obj, f.text), ID: lookupPath(obj, f.id)}
	}
	return checkManifestLine(raw)
}

// lookupPath returns the value at a dotted path of nested objects, or nil.
// A key that itself holds a dot is found before the path is split.
func lookupPath(obj map[string]json.RawMessage, path string) json.RawMessage {
	if v, ok := obj[path]; ok {
		return v
	}
	head, rest, ok := strings.Cut(path, ".")
	if !ok {
		return nil
	}
	var inner map[string]json.RawMessage
	if json.Unmarshal(obj[head], &inner) != nil {
		return nil
	}
	return lookupPath(inner, rest)
}

// checkManifestLine checks the types of a line's fields.
func checkManifestLine(raw rawManifestLine) (manifestLine, string, string) {
	var out manifestLine
	var ok bool
	if out.ID, ok = jsonScalar(raw.ID); !ok {
		return out, ReasonBadManifestLine, "id is not a string or number"
	}
	if isNull(raw.Image) {
		return out, ReasonMissingImage, "no image field"
	}
	if err := json.Unmarshal(raw.Image, &out.Image); err != nil {
		return out, ReasonBadManifestLine, "image is not a string"
	}
	if out.Image == "" {
		return out, ReasonMissingImage, "empty image path"
	}
	text := raw.Text
	if isNull(text) {
		text = raw.Caption
	}
	if isNull(text) {
		return out, ReasonMissingCaption, "no text field"
	}
	if err := json.Unmarshal(text, &out.Text); err != nil {
		return out, ReasonBadManifestLine, "text is not a string"
	}
	return out, "", ""
}

func isNull(m json.RawMessage) bool { return len(m) == 0 || string(m) == "null" }

// jsonScalar returns a string or number as a string; null/absent gives "".
func jsonScalar(m json.RawMessage) (string, bool) {
	if isNull(m) {
		return "", true
	}
	if m[0] == '"' {
		var s string
		err := json.Unmarshal(m, &s)
		return s, err == nil
	}
	var n json.Number
	if err := json.Unmarshal(m, &n); err != nil {
		return "", false
	}
	return n.String(), true
}

// utf8BOM is the UTF-8 encoding of U+FEFF, which a manifest may start with.
var utf8BOM = []byte("\xef\xbb\xbf")

// manifestSource reads a JSONL manifest.
type manifestSource struct {
	base
	path     string // as given, used in locations
	name     string // base name, used in derived ids
	root     string // the manifest's folder
	realRoot string // root with symbolic links resolved
	f        *os.File
	br       *bufio.Reader
	line     int
	dirs     map[string]dirCheck // relative dir → containment result
	fields   manifestFields
	pos      int64       // bytes of the file read so far
	records  *recordFile // set by packRecords: entries are located by rec, their strings not kept
	rec      record      // the line of the entry next returned last
}

// dirCheck is the containment result of one directory: a reject reason, or
// the directory with its symbolic links resolved.
type dirCheck struct{ reason, detail, real string }

func openManifest(path string, opts Options) (*manifestSource, error) {
	dir := filepath.Dir(path)
	if opts.Root != "" {
		dir = opts.Root
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	f, _, err := openRegular(path)
	if err != nil {
		return nil, fmt.Errorf("loader: open %s: %w", path, err)
	}
	return &manifestSource{
		base: base{opts: opts}, path: path, name: filepath.Base(path),
		root: root, realRoot: realRoot, f: f,
		br: bufio.NewReaderSize(f, 64<<10), dirs: map[string]dirCheck{},
		fields: manifestFields{opts.ImageColumn, opts.TextColumn, opts.IDColumn},
	}, nil
}

// Next implements Source.
func (m *manifestSource) Next(ctx context.Context) (Sample, error) { return nextSample(ctx, m) }

// packRecords implements recordSource.
func (m *manifestSource) packRecords() {
	if m.records != nil {
		return
	}
	abs, err := filepath.Abs(m.path)
	if err != nil {
		abs = m.path
	}
	m.records = &recordFile{loc: m.path, path: abs, imgRoot: m.realRoot, name: m.name, fields: m.fields}
}

// lastRecord implements recordSource.
func (m *manifestSource) lastRecord() (record, bool) { return m.rec, m.records != nil && m.rec.ok }

// manifestID is a line's id: its own, else derived from the manifest's
// base name, the image path and the caption.
func manifestID(name string, ml manifestLine) string {
	if ml.ID != "" {
		return ml.ID
	}
	return DeriveID(name, ml.Image+"\n"+ml.Text)
}

// Close implements Source.
func (m *manifestSource) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	return m.f.Close()
}

func (m *manifestSource) next(ctx context.Context, withImage bool) (Entry, []byte, error) {
	if m.closed {
		return Entry{}, nil, ErrClosed
	}
	for {
		if err := ctx.Err(); err != nil {
			return Entry{}, nil, err
		}
		start := m.pos
		line, tooLong, err := m.readLine()
		if err != nil {
			return Entry{}, nil, err
		}
		if m.line == 1 && bytes.HasPrefix(line, utf8BOM) { // a UTF-8 byte order mark some editors write is no part of the first line
			line, start = line[len(utf8BOM):], start+int64(len(utf8BOM))
		}
		m.rec = record{file: m.records, off: start, n: uint32(len(line)), line: uint32(m.line),
			ok: len(line) <= math.MaxUint32 && m.line <= math.MaxUint32}
		if !tooLong && len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		loc := m.path + ":" + strconv.Itoa(m.line)
		if tooLong {
			m.reject("", loc, ReasonTooLarge, fmt.Sprintf("line over %d bytes", m.maxLine()))
			continue
		}
		if e, img, ok := m.entry(ctx, line, loc, withImage); ok {
			m.tally.Emit()
			return e, img, nil
		}
	}
}

// entry turns a line into an entry, reporting a reject when it is bad.
func (m *manifestSource) entry(ctx context.Context, line []byte, loc string, withImage bool) (Entry, []byte, bool) {
	ml, reason, detail := parseManifestFields(line, m.fields)
	id := ml.ID
	if id == "" && reason == "" {
		id = manifestID(m.name, ml)
	}
	if reason != "" {
		m.reject(id, loc, reason, detail)
		return Entry{}, nil, false
	}
	if int64(len(ml.Text)) > m.opts.MaxCaptionBytes {
		m.reject(id, loc, ReasonTooLarge, fmt.Sprintf("caption %d bytes > max %d", len(ml.Text), m.opts.MaxCaptionBytes))
		return Entry{}, nil, false
	}
	if r := CheckCaption(ml.Text); r != "" {
		m.reject(id, loc, r, "")
		return Entry{}, nil, false
	}
	root, full, size, reason, detail := m.resolve(ml.Image)
	if reason == "" {
		reason, detail = checkSize(size, m.opts.MaxImageBytes)
	}
	if reason != "" {
		m.reject(id, loc, reason, detail)
		return Entry{}, nil, false
	}
	e := Entry{ID: id, Location: loc, Text: ml.Text, ImageName: baseName(ml.Image),
		ImageSize: size, ref: imageRef{kind: refFile, root: root, path: full}}
	m.json = line
	if !withImage {
		m.rec.sum, m.rec.plain = recordSum(line), root == m.realRoot && full == ml.Image
		return e, nil, true
	}
	img, err := readFileRange(ctx, e, 0, size, true)
	if err != nil {
		m.reject(id, loc, readReason(err), err.Error())
		return Entry{}, nil, false
	}
	return e, img, true
}

// checkSize classifies an image size.
func checkSize(size, max int64) (string, string) {
	switch {
	case size == 0:
		return ReasonEmptyImage, "zero-byte image"
	case size > max:
		return ReasonTooLarge, fmt.Sprintf("image %d bytes > max %d", size, max)
	}
	return "", ""
}

func (m *manifestSource) maxLine() int64 { return m.opts.MaxCaptionBytes + 64<<10 }

// readLine returns the next line without its newline. A line over maxLine is
// consumed and reported with tooLong. io.EOF at the end.
func (m *manifestSource) readLine() (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := m.br.ReadSlice('\n')
		m.pos += int64(len(chunk))
		if !tooLong {
			if int64(len(buf)+len(chunk)) > m.maxLine() {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case err == nil:
			m.line++
			return buf, tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && (len(buf) > 0 || tooLong):
			m.line++
			return buf, tooLong, nil
		case errors.Is(err, io.EOF):
			return nil, false, io.EOF
		default:
			return nil, false, fmt.Errorf("loader: read %s: %w", m.path, err)
		}
	}
}

// resolve checks a manifest image path and returns where to open it (the
// resolved root and the path below it, with every symbolic link resolved;
// root "" for an allowed absolute path, opened as given) and the file size,
// or a reject reason.
func (m *manifestSource) resolve(img string) (string, string, int64, string, string) {
	if img == "" {
		return "", "", 0, ReasonMissingImage, "empty image path"
	}
	if filepath.IsAbs(img) {
		if !m.opts.AllowAbsolute {
			return "", "", 0, ReasonEscapesRoot, "absolute path not allowed: " + img
		}
		full := filepath.Clean(img)
		fi, err := os.Stat(full)
		full, size, reason, detail := statResult(full, img, fi, err)
		return "", full, size, reason, detail
	}
	rel := filepath.FromSlash(img)
	if !filepath.IsLocal(rel) {
		return "", "", 0, ReasonEscapesRoot, "path leaves the manifest folder: " + img
	}
	c := m.checkDir(filepath.Dir(rel))
	if c.reason != "" {
		return "", "", 0, c.reason, c.detail
	}
	full := filepath.Join(c.real, filepath.Base(rel))
	fi, err := os.Lstat(full)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		real, reason, detail := m.checkLink(full)
		if reason != "" {
			return "", "", 0, reason, detail
		}
		full = real
		fi, err = os.Stat(full)
	}
	full, size, reason, detail := statResult(full, img, fi, err)
	return m.realRoot, m.below(full, rel), size, reason, detail
}

// below is the path an entry keeps for full, an image below the manifest
// folder: rel itself (the line's own string, which ImageName shares) when it
// is clean and names full from the resolved root, else full relative to that root, else
// full (openIn takes either).
func (m *manifestSource) below(full, rel string) string {
	if full == "" || m.realRoot == "" {
		return full
	}
	if filepath.Clean(rel) == rel && filepath.Join(m.realRoot, rel) == full {
		return rel
	}
	if r, err := filepath.Rel(m.realRoot, full); err == nil && filepath.IsLocal(r) {
		return r
	}
	return full
}

// statResult classifies a stat of an image path.
func statResult(full, img string, fi fs.FileInfo, err error) (string, int64, string, string) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", 0, ReasonMissingImage, err.Error()
	case err != nil:
		return "", 0, ReasonUnreadableImage, err.Error()
	case !fi.Mode().IsRegular():
		return "", 0, ReasonNotRegular, kindOf(fi.Mode()) + ": " + img
	}
	return full, fi.Size(), "", ""
}

// checkDir checks (once per directory) that a relative directory resolves
// inside the manifest folder.
func (m *manifestSource) checkDir(rel string) dirCheck {
	if rel == "." {
		return dirCheck{real: m.realRoot}
	}
	if c, ok := m.dirs[rel]; ok {
		return c
	}
	c := dirCheck{}
	real, err := filepath.EvalSymlinks(filepath.Join(m.root, rel))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c = dirCheck{reason: ReasonMissingImage, detail: err.Error()}
	case err != nil:
		c = dirCheck{reason: ReasonUnreadableImage, detail: err.Error()}
	case !m.inside(real):
		c = dirCheck{reason: ReasonEscapesRoot, detail: "directory links outside the manifest folder: " + filepath.ToSlash(rel)}
	default:
		c.real = real
	}
	if len(m.dirs) < 1<<16 {
		m.dirs[rel] = c
	}
	return c
}

// checkLink resolves the symbolic link full and checks its target stays
// inside the manifest folder.
func (m *manifestSource) checkLink(full string) (string, string, string) {
	real, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", ReasonMissingImage, "dangling link: " + err.Error()
	}
	if !m.inside(real) {
		return "", ReasonEscapesRoot, "link points outside the manifest folder: " + real
	}
	return real, "", ""
}

func (m *manifestSource) inside(real string) bool { return within(m.realRoot, real) }

// readReason classifies an error reading an image or caption that passed
// its checks at listing time.
func readReason(err error) string {
	switch {
	case errors.Is(err, ErrNotRegular):
		return ReasonNotRegular
	case errors.Is(err, ErrEscapesRoot):
		return ReasonEscapesRoot
	case errors.Is(err, ErrTooLarge):
		return ReasonTooLarge
	case errors.Is(err, fs.ErrNotExist):
		return ReasonMissingImage
	}
	return ReasonUnreadableImage
}

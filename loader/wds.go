package loader

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// posReader tracks the offset of a shard as archive/tar reads and seeks
// through it, so each member's data offset is known.
type posReader struct {
	f   io.ReadSeekCloser
	pos int64
}

func (p *posReader) Read(b []byte) (int, error) {
	n, err := p.f.Read(b)
	p.pos += int64(n)
	return n, err
}

func (p *posReader) Seek(off int64, whence int) (int64, error) {
	n, err := p.f.Seek(off, whence)
	if err == nil {
		p.pos = n
	}
	return n, err
}

// tarGroup accumulates the members of one WebDataset sample.
type tarGroup struct {
	key      string
	loc      string
	imgName  string
	imgOff   int64
	imgSize  int64
	img      []byte
	hasImage bool
	text     string
	hasText  bool
	textRank int      // index in the text keys of the member the caption came from (lower wins)
	capOff   int64    // the data offset of the member the caption came from
	capData  []byte   // that member's data
	json     []byte   // the .json member, when read (a text key, or kept fields)
	exts     []string // the member extensions read, to tell a repeated member
	id       string
	reason   string // first problem seen in the group
	detail   string
}

// tarSource reads WebDataset shards in order.
type tarSource struct {
	base
	shards  []string
	cur     int // index of the open shard, len(shards) when done
	pr      shardStream
	gz      *gzStream // pr of a .tar.gz shard, else nil
	size    int64     // of the open shard; -1 for a .tar.gz (unknown until inflated)
	tr      *tar.Reader
	pending *tar.Header                                          // first member of the next group, data not yet read
	broken  string                                               // tar error to report before moving to the next shard
	open    func(root, path string) (io.ReadSeekCloser, error)   // a local shard, below root (see openIn)
	root    string                                               // the open local shard's folder, resolved by pinFile
	path    string                                               // the open local shard, resolved by pinFile
	stream  func(context.Context, string) (io.ReadCloser, error) // remote shards: read as unseekable streams when set
	ctxr    *ctxStream                                           // the open remote stream, else nil
	keys    wdsKeys
	prev    keyRun      // the open shard's last group key
	records bool        // set by packRecords: Scan packs the entries of local .tar shards
	file    *recordFile // the open shard's, when records and it is a local .tar
	rec     record      // the entry next returned last
	recOK   bool        // rec locates it
}

// keyRun is the key of a shard's last group and how many groups in a row
// had it (ok false before the first group).
type keyRun struct {
	key string
	ok  bool
	n   int
}

func newTarSource(shards []string, opts Options) *tarSource {
	keys, _ := parseWDSKeys(opts.WDSImageKeys, opts.WDSTextKeys) // checked by Options.Validate
	return &tarSource{base: base{opts: opts}, shards: shards, cur: -1, keys: keys,
		open: func(root, p string) (io.ReadSeekCloser, error) {
			f, _, err := openIn(root, p)
			return f, err
		}}
}

// Next implements Source.
func (s *tarSource) Next(ctx context.Context) (Sample, error) { return nextSample(ctx, s) }

// Close implements Source.
func (s *tarSource) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.closeShard()
}

func (s *tarSource) closeShard() error {
	if s.pr == nil {
		return nil
	}
	err := s.pr.Close()
	s.pr, s.gz, s.ctxr, s.tr, s.pending, s.broken, s.file = nil, nil, nil, nil, nil, "", nil
	s.prev = keyRun{}
	return err
}

// openNext opens the next shard; io.EOF when none is left.
func (s *tarSource) openNext(ctx context.Context) error {
	if err := s.closeShard(); err != nil {
		return fmt.Errorf("loader: close %s: %w", s.shards[s.cur], err)
	}
	s.cur++
	if s.cur >= len(s.shards) {
		return io.EOF
	}
	if s.stream != nil {
		return s.openStream(ctx)
	}
	s.root, s.path = pinFile(s.shards[s.cur])
	f, err := s.open(s.root, s.path)
	if err != nil {
		return fmt.Errorf("loader: open %s: %w", s.shards[s.cur], err)
	}
	if isGzipShard(s.shards[s.cur]) {
		return s.openGz(f)
	}
	if s.records {
		s.file = &recordFile{loc: s.shards[s.cur], root: s.root, path: s.path, tar: true, keys: s.keys}
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("loader: open %s: %w", s.shards[s.cur], err)
	}
	s.pr, s.size = &posReader{f: f}, size
	s.tr = tar.NewReader(s.pr)
	return nil
}

// openStream starts reading a remote shard as a stream (size unknown). The
// stream lives until the shard is closed; a done ctx of the Next call that
// reads it aborts a blocked open or read.
func (s *tarSource) openStream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	rc, err := s.stream(sctx, s.shards[s.cur])
	stop()
	if err == nil && ctx.Err() != nil {
		rc.Close()
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		return fmt.Errorf("loader: open %s: %w", s.shards[s.cur], err)
	}
	c := &ctxStream{r: rc, ctx: ctx, cancel: cancel}
	s.ctxr = c
	if isGzipShard(s.shards[s.cur]) {
		return s.openGz(c)
	}
	s.pr, s.size = c, -1
	s.tr = tar.NewReader(c)
	return nil
}

// openGz starts reading a .tar.gz shard; a stream that is not gzip is a
// broken shard (one reject), not a failed source.
func (s *tarSource) openGz(f io.ReadCloser) error {
	gz, err := newGzStream(f)
	if err != nil {
		f.Close()
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err // cut short by the caller: no reject
		}
		s.broken = "gzip: " + err.Error()
		return nil
	}
	s.pr, s.gz, s.size = gz, gz, -1
	s.tr = tar.NewReader(gz)
	return nil
}

func (s *tarSource) next(ctx context.Context, withImage bool) (Entry, []byte, error) {
	if s.closed {
		return Entry{}, nil, ErrClosed
	}
	for {
		if err := ctx.Err(); err != nil {
			return Entry{}, nil, err
		}
		if s.tr == nil && s.broken == "" {
			if err := s.openNext(ctx); err != nil {
				return Entry{}, nil, err
			}
		}
		if s.broken != "" {
			s.reject("", s.shardLoc(""), ReasonBrokenTar, s.broken)
			s.tr, s.broken = nil, ""
			continue
		}
		if s.gz != nil {
			s.gz.ctx = ctx
		}
		if s.ctxr != nil {
			s.ctxr.ctx = ctx
		}
		g, ok := s.readGroup(ctx, withImage)
		if err := ctx.Err(); err != nil { // a read cut short by ctx is no reject
			return Entry{}, nil, err
		}
		if !ok {
			continue
		}
		if e, img, ok := s.finish(g); ok {
			s.tally.Emit()
			return e, img, nil
		}
	}
}

func (s *tarSource) shardLoc(key string) string {
	if key == "" {
		return s.shards[s.cur]
	}
	return s.shards[s.cur] + ":" + key
}

// readGroup reads the members of the next sample. ok is false when the
// shard ended (or broke) before any member of a new group.
func (s *tarSource) readGroup(ctx context.Context, withImage bool) (*tarGroup, bool) {
	var g *tarGroup
	for {
		hdr := s.pending
		s.pending = nil
		if hdr == nil {
			var err error
			hdr, err = s.tr.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.broken = fmt.Sprintf("at offset %d: %v", s.pr.offset(), err)
				} else {
					s.tr = nil
					if s.gz != nil {
						s.broken = finishGz(s.gz)
					}
				}
				return g, g != nil
			}
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if isSparse(hdr) {
			s.broken = "sparse member " + hdr.Name + " (unsupported)"
			return g, g != nil
		}
		key, ext := splitKey(hdr.Name)
		if g != nil && (key != g.key || slices.Contains(g.exts, ext)) {
			s.pending = hdr // a new key, or a member repeated: the next group
			return g, true
		}
		if g == nil {
			g = s.newGroup(key)
		}
		g.exts = append(g.exts, ext)
		if !localName(hdr.Name) {
			g.setProblem(ReasonEscapesRoot, "member name leaves the archive: "+hdr.Name)
		}
		if !s.addMember(ctx, g, hdr, ext, withImage) {
			return g, true
		}
	}
}

// newGroup starts the group of key. A group with the key of the group
// before it (a member name repeated, as when a writer wrote a sample twice)
// is a duplicate: it is read and quarantined as duplicate_id at its own
// location (key#2, key#3, ...), never dropped without a line.
func (s *tarSource) newGroup(key string) *tarGroup {
	g := &tarGroup{key: key, loc: s.shardLoc(key)}
	if s.prev.ok && s.prev.key == key {
		s.prev.n++
		g.loc += "#" + strconv.Itoa(s.prev.n)
		g.setProblem(ReasonDuplicateID, "key "+key+" repeats in the shard, first at "+s.shardLoc(key))
		return g
	}
	s.prev = keyRun{key: key, ok: true, n: 1}
	return g
}

// localName reports whether a member name stays inside the archive when
// extracted: relative, without ".." elements (a "tar-slip" name is
// quarantined as escapes_root, although the loader never extracts).
func localName(name string) bool {
	return name != "" && !strings.HasPrefix(name, "/") && filepath.IsLocal(filepath.FromSlash(name))
}

// isSparse reports a PAX sparse member, whose data is not stored
// contiguously (its offset could not be re-read).
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// splitKey splits a member name into the WebDataset key (path up to the
// first dot of the base name) and the lower-case extension after that dot.
func splitKey(name string) (string, string) {
	dir, file := path.Split(name)
	key, ext, _ := strings.Cut(file, ".")
	return dir + key, strings.ToLower(ext)
}

// addMember folds one member into g. It returns false when the member's data
// could not be read (the shard is broken from here).
func (s *tarSource) addMember(ctx context.Context, g *tarGroup, hdr *tar.Header, ext string, withImage bool) bool {
	last := ext[strings.LastIndexByte(ext, '.')+1:] // "seg.png" is a png, "en.txt" a caption
	if !s.keys.text(ext) {
		ext = last
	}
	switch {
	case (s.keys.image(ext) || s.keys.image(last)) && !g.hasImage:
		g.hasImage, g.imgName, g.imgOff, g.imgSize = true, path.Base(hdr.Name), s.pr.offset(), hdr.Size
		if reason, detail := checkSize(hdr.Size, s.opts.MaxImageBytes); reason != "" {
			g.setProblem(reason, detail)
			return true
		}
		if s.size >= 0 && s.pr.offset()+hdr.Size > s.size { // cut short: found without reading the data
			g.setProblem(ReasonBrokenTar, fmt.Sprintf("member %s: %d bytes at %d, shard ends at %d", hdr.Name, hdr.Size, s.pr.offset(), s.size))
			g.reason = ReasonBrokenTar
			return true
		}
		if withImage {
			return s.readData(ctx, g, hdr, &g.img)
		}
		if s.size < 0 { // a stream's member is known whole only once read
			return s.skipData(g, hdr)
		}
	case s.keys.text(ext):
		if hdr.Size > s.opts.MaxCaptionBytes {
			g.setProblem(ReasonTooLarge, fmt.Sprintf("caption %d bytes > max %d", hdr.Size, s.opts.MaxCaptionBytes))
			return true
		}
		var data []byte
		off := s.pr.offset()
		if !s.readData(ctx, g, hdr, &data) {
			return false
		}
		g.addCaption(s.keys, ext, data, off)
		if ext == "json" {
			g.json = data
		}
	case ext == "json" && g.json == nil && keepNeedsJSON(s.opts.Keep):
		if hdr.Size > s.opts.MaxCaptionBytes { // kept fields missing, the sample fine
			return s.skipData(g, hdr)
		}
		return s.readData(ctx, g, hdr, &g.json)
	}
	return true
}

// skipData inflates and drops a member's data, checking it is all there.
func (s *tarSource) skipData(g *tarGroup, hdr *tar.Header) bool {
	if _, err := io.CopyN(io.Discard, s.tr, hdr.Size); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return s.brokenRead(g, hdr, err)
	}
	return true
}

func (s *tarSource) readData(ctx context.Context, g *tarGroup, hdr *tar.Header, dst *[]byte) bool {
	buf := make([]byte, hdr.Size)
	if err := readFull(ctx, s.tr, buf); err != nil {
		return s.brokenRead(g, hdr, err)
	}
	*dst = buf
	return true
}

// brokenRead marks g broken by a failed member read and ends the shard.
func (s *tarSource) brokenRead(g *tarGroup, hdr *tar.Header, err error) bool {
	g.setProblem(ReasonBrokenTar, fmt.Sprintf("member %s: %v", hdr.Name, err))
	g.reason = ReasonBrokenTar // a broken read wins over earlier problems
	s.tr = nil                 // the stream cannot be trusted any more
	return false
}

// addCaption takes the caption from a member with extension ext: its whole
// text, or a JSON member's field, as the text keys say; the first key in their
// order that a group holds wins. A JSON member's "id" gives the sample id.
func (g *tarGroup) addCaption(keys wdsKeys, ext string, data []byte, off int64) {
	var obj map[string]json.RawMessage
	if keys.json(ext) {
		if err := json.Unmarshal(data, &obj); err != nil {
			g.setProblem(ReasonBadCaption, "."+ext+": "+err.Error())
			return
		}
		if id, ok := jsonScalar(obj["id"]); ok && id != "" {
			g.id = id
		}
	}
	for rank, k := range keys.texts {
		if k.ext != ext || (g.hasText && g.textRank <= rank) {
			continue
		}
		if k.field == "" {
			g.text, g.hasText, g.textRank, g.capOff, g.capData = string(data), true, rank, off, data
			return
		}
		var text string
		if v := lookupPath(obj, k.field); !isNull(v) && json.Unmarshal(v, &text) == nil {
			g.text, g.hasText, g.textRank, g.capOff, g.capData = text, true, rank, off, data
			return
		}
	}
}

func (g *tarGroup) setProblem(reason, detail string) {
	if g.reason == "" {
		g.reason, g.detail = reason, detail
	}
}

// finish turns a complete group into an entry, or rejects it.
func (s *tarSource) finish(g *tarGroup) (Entry, []byte, bool) {
	id := g.id
	if id == "" {
		id = g.key
	}
	reason, detail := g.reason, g.detail
	switch {
	case reason != "":
	case !g.hasImage:
		reason, detail = ReasonMissingImage, "no image member ("+s.keys.imageList()+")"
	case !g.hasText:
		reason, detail = ReasonMissingCaption, "no caption member ("+s.keys.textList()+")"
	default:
		reason = CheckCaption(g.text)
	}
	if reason != "" {
		s.reject(id, g.loc, reason, detail)
		return Entry{}, nil, false
	}
	e := Entry{ID: id, Location: g.loc, Text: g.text, ImageName: g.imgName, ImageSize: g.imgSize,
		ref: imageRef{kind: refTar, root: s.root, path: s.path, off: g.imgOff}}
	s.json = g.json
	if s.stream != nil { // a remote shard: its key, read through Options.Remote
		e.ref.root, e.ref.path = "", s.shards[s.cur]
	}
	if s.gz != nil {
		e.ref.kind = refTarGz
	}
	s.recOK = s.file != nil && s.gz == nil && s.stream == nil && len(g.capData) <= math.MaxUint32
	if s.recOK {
		s.rec = record{file: s.file, off: g.capOff, n: uint32(len(g.capData)), sum: recordSum(g.capData), ok: true,
			tar: tarRecord{imgOff: g.imgOff, key: g.key, imgName: g.imgName, rank: g.textRank,
				suffix: strings.TrimPrefix(g.imgName, path.Base(g.key))}}
	}
	return e, g.img, true
}

// packRecords implements recordSource.
func (s *tarSource) packRecords() { s.records = true }

// lastRecord implements recordSource: local .tar shards only (a .tar.gz
// or a remote shard cannot be re-read by offset cheaply).
func (s *tarSource) lastRecord() (record, bool) { return s.rec, s.recOK }

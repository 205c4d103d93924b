package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"slices"
	"sync"

	"github.com/disintegration/imaging"
	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/imgproc"
	"github.com/mmfeed/mmfeed/loader"
)

// ThumbnailSize is the longest side of a report thumbnail, in pixels.
const ThumbnailSize = 160

// Thumbnails makes report thumbnails of the samples that drive cost in plan
// (built from p's items): the n heaviest, then the n planned samples with the
// most extreme aspect ratio not already shown. Pictures are for people: they
// are decoded and resized with github.com/disintegration/imaging (EXIF
// orientation applied), not with imgproc's bit-exact resampler. A sample that
// no longer reads or decodes is skipped, never an error; only ctx's error is
// returned.
func Thumbnails(ctx context.Context, p *Prepared, plan *balancer.Plan, n int) ([]balancer.Thumbnail, error) {
	heavy := plan.Heaviest(n)
	shown := map[int32]bool{}
	var out []balancer.Thumbnail
	add := func(kind string, items []int32) error {
		for _, i := range items {
			if err := ctx.Err(); err != nil {
				return err
			}
			if shown[i] {
				continue
			}
			shown[i] = true
			t, err := thumbnail(p, plan, i)
			if err != nil {
				continue // the sample changed or does not decode; the report shows the others
			}
			t.Kind = kind
			out = append(out, t)
		}
		return nil
	}
	if err := add("heaviest", heavy); err != nil {
		return nil, err
	}
	var aspect []int32
	for _, i := range plannedItems(plan) {
		if !slices.Contains(heavy, i) {
			aspect = append(aspect, i)
		}
	}
	slices.SortStableFunc(aspect, func(a, b int32) int {
		ra, rb := aspectOf(p.Features.Sizes[a]), aspectOf(p.Features.Sizes[b])
		switch {
		case ra > rb:
			return -1
		case ra < rb:
			return 1
		}
		return 0
	})
	return out, add("aspect", aspect[:min(n, len(aspect))])
}

// aspectOf is the long side over the short side (1 for a square or no size).
func aspectOf(s image.Point) float64 {
	if s.X <= 0 || s.Y <= 0 {
		return 1
	}
	return float64(max(s.X, s.Y)) / float64(min(s.X, s.Y))
}

// plannedItems lists the plan's real samples in plan order.
func plannedItems(plan *balancer.Plan) []int32 {
	var out []int32
	for _, s := range plan.Steps {
		for _, rank := range s.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight > 0 {
						out = append(out, e.Item)
					}
				}
			}
		}
	}
	return out
}

func thumbnail(p *Prepared, plan *balancer.Plan, i int32) (balancer.Thumbnail, error) {
	e, it := p.Features.Entry(int(i)), p.Features.Items[i]
	build := func() (thumb, error) {
		data, err := p.Index.ReadImage(e)
		if err != nil {
			return thumb{}, err
		}
		var t thumb
		t.jpg, t.w, t.h, err = ThumbnailJPEG(data, p.Config.Image.MaxImagePixels)
		return t, err
	}
	var t thumb
	var err error
	if p.ds != nil {
		t, err = p.ds.thumbs.get(e.ID, build)
	} else {
		t, err = build()
	}
	if err != nil {
		return balancer.Thumbnail{}, err
	}
	jpg, w, h := t.jpg, t.w, t.h
	return balancer.Thumbnail{ID: e.ID, Width: w, Height: h, TextTokens: it.TextTokens, ImageTokens: it.ImageTokens,
		Cost: plan.ItemCost(i), MIME: "image/jpeg", Image: jpg}, nil
}

// ThumbnailJPEG decodes an image file (EXIF orientation applied), fits it in
// ThumbnailSize² and encodes it as JPEG. Images of more than maxPixels pixels
// (by their header) are refused before decoding; a decoder panic is an error.
func ThumbnailJPEG(data []byte, maxPixels int) (jpg []byte, w, h int, err error) {
	hdr, err := imgproc.ReadHeader(data)
	if err != nil {
		return nil, 0, 0, err
	}
	if maxPixels > 0 {
		if err := checkPixels(hdr, maxPixels); err != nil {
			return nil, 0, 0, err
		}
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pipeline: thumbnail decode: %v: %w", r, imgproc.ErrCorrupt)
		}
	}()
	img, err := imaging.Decode(bytes.NewReader(data), imaging.AutoOrientation(true))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("pipeline: thumbnail decode: %w", err)
	}
	img = imaging.Fit(img, ThumbnailSize, ThumbnailSize, imaging.Lanczos)
	var buf bytes.Buffer
	if err := imaging.Encode(&buf, img, imaging.JPEG, imaging.JPEGQuality(85)); err != nil {
		return nil, 0, 0, err
	}
	b := img.Bounds()
	return buf.Bytes(), b.Dx(), b.Dy(), nil
}

// QuarantineReasons returns q's counts by reason with example ids, for a report.
func QuarantineReasons(q *loader.QuarantineWriter) map[string]balancer.QuarantineGroup {
	ex := q.Examples()
	out := map[string]balancer.QuarantineGroup{}
	for r, n := range q.Counts() {
		out[r] = balancer.QuarantineGroup{Count: n, Examples: ex[r]}
	}
	return out
}

// thumb is one sample's report thumbnail: JPEG bytes and size.
type thumb struct {
	jpg  []byte
	w, h int
}

// thumbCache keeps the thumbnails a dataset's epochs made, by sample id:
// the heaviest and most extreme samples of one epoch are mostly those of
// the next, so each epoch's report decodes only the new ones. Failures are
// not kept (the next epoch tries again). Safe for concurrent use.
type thumbCache struct {
	mu sync.Mutex
	m  map[string]thumb
}

// thumbCacheMax bounds the thumbnails kept (about 5 KiB each); a full cache
// starts over.
const thumbCacheMax = 256

func (c *thumbCache) get(id string, build func() (thumb, error)) (thumb, error) {
	c.mu.Lock()
	t, ok := c.m[id]
	c.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := build()
	if err != nil {
		return t, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= thumbCacheMax {
		c.m = map[string]thumb{}
	}
	c.m[id] = t
	c.mu.Unlock()
	return t, nil
}

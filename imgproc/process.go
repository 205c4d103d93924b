package imgproc

import (
	"fmt"
	"sync"
)

// Image is one processed image: the tensor and what the trainer and the
// balancer need to know about it.
type Image struct {
	// Data is the CHW tensor, little-endian, 3*H*W elements of DType.
	// The caller owns it.
	Data []byte
	// DType is the element type (Config.DType).
	DType string
	// Shape is [3, H, W].
	Shape [3]int
	// Grid is the patch grid [H/PatchSize, W/PatchSize]; Grid[0]*Grid[1]
	// image tokens.
	Grid [2]int
	// Mean and Std are the normalization parameters (0..1 pixel units).
	// Float outputs are already normalized; uint8 outputs are raw pixels
	// that the trainer normalizes as (x/255-Mean)/Std.
	Mean, Std [3]float32
	// Complexity is the pixel-based complexity estimate in [0, 1].
	Complexity float64
	// SrcWidth and SrcHeight are the source's display size (EXIF oriented).
	SrcWidth, SrcHeight int
	// Format is the sniffed source format.
	Format string
	// Crop is the augmentation applied (ProcessSample); zero otherwise.
	Crop Crop
	// Source is true when Data is the source file's own bytes
	// (DTypeJPEGSource with an acceptable JPEG); Shape is then the planned
	// size the trainer resizes it to.
	Source bool
}

// Processor decodes and transforms images for one Config. It is safe for
// concurrent use; scratch buffers are pooled, so steady-state processing
// allocates little besides the returned tensor and what the pure-Go
// decoders allocate.
type Processor struct {
	cfg       Config
	mean, std [3]float32
	kern      kernel
	norm      *normalizer
	pool      sync.Pool
}

// scratch holds per-call reusable buffers.
type scratch struct {
	rgb, rot, out []byte
	crop          []byte // the augmentation's crop box
	res           resampler
	cplx          []float32
	turbo         []byte
	turboState    any      // *tjHandle in the turbojpeg build
	red           []byte   // DecodeReduce's box-reduced image
	redAcc        []uint32 // its row accumulator
}

// NewProcessor validates c and precomputes lookup tables.
func NewProcessor(c Config) (*Processor, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := &Processor{cfg: c, kern: bilinearKernel}
	if c.Filter == FilterBicubic {
		p.kern = bicubicKernel
	}
	p.mean, p.std = c.MeanStd()
	p.norm = newNormalizer(c.pixelDType(), p.mean, p.std)
	p.pool.New = func() any { return new(scratch) }
	return p, nil
}

// maxPooled caps the scratch memory a pooled scratch may keep: buffers of
// rare huge images are dropped rather than pinned in the pool.
const maxPooled = 32 << 20

func (p *Processor) release(s *scratch) {
	for _, b := range []*[]byte{&s.rgb, &s.rot, &s.crop, &s.turbo, &s.red, &s.res.tmp} {
		if cap(*b) > maxPooled {
			*b = nil
		}
	}
	p.pool.Put(s)
}

// Config returns the processor's configuration.
func (p *Processor) Config() Config { return p.cfg }

// Process decodes data (format sniffed from content), applies the EXIF
// orientation, converts to RGB over the background, resizes and crops by
// the policy and encodes the tensor. Errors wrap ErrEmpty, ErrTooLarge,
// ErrUnsupported or ErrCorrupt; Process never panics on bad input.
func (p *Processor) Process(data []byte) (img Image, err error) {
	return p.ProcessInto(nil, data)
}

// TensorBytes is the byte size of the tensor Process returns for a source of
// w×h display pixels (Header.Width/Height); 0 for invalid sizes.
func (p *Processor) TensorBytes(w, h int) int {
	ow, oh := p.cfg.OutputSize(w, h)
	return 3 * ow * oh * p.cfg.ElemSize()
}

// ProcessInto is Process writing the tensor into dst when it is large enough
// (cap(dst) >= TensorBytes), so callers can decode straight into a batch
// buffer; Image.Data then aliases dst. Otherwise it allocates, like Process.
// Under the JPEG wire dtypes dst is not used: Data is the JPEG (or,
// DTypeJPEGSource, data itself when acceptable).
func (p *Processor) ProcessInto(dst, data []byte) (img Image, err error) {
	return p.process(dst, data, nil)
}

// process is ProcessInto, augmented by Config.Augment with parameters drawn
// from r when r is not nil.
func (p *Processor) process(dst, data []byte, r Rand) (img Image, err error) {
	defer func() {
		if r := recover(); r != nil {
			img, err = Image{}, fmt.Errorf("imgproc: process: panic: %v: %w", r, ErrCorrupt)
		}
	}()
	hdr, err := p.checkedHeader(data)
	if err != nil {
		return Image{}, err
	}
	if p.cfg.DType == DTypeJPEGSource && SourceJPEGAcceptable(hdr) {
		return p.sourceImage(data, hdr), nil
	}
	rawW, rawH := hdr.Width, hdr.Height
	if hdr.Orientation >= 5 {
		rawW, rawH = rawH, rawW
	}
	var cr Crop
	if r != nil {
		cr = p.cfg.Augment.Sample(r, hdr.Width, hdr.Height)
	}
	g, _ := p.cfg.augmentPlan(hdr.Width, hdr.Height, cr)
	s := p.pool.Get().(*scratch)
	defer p.release(s)
	dg := g
	if cr.cropped() { // decode at full size: the box is in full-size pixels
		dg = geom{rw: hdr.Width, rh: hdr.Height}
	}
	pix, w, h, err := p.decodeRGB(data, hdr, rawW, rawH, dg, s)
	if err != nil {
		return Image{}, err
	}
	if hdr.Orientation >= 2 {
		pix, w, h = orient(pix, w, h, hdr.Orientation, s.rot)
		s.rot, s.rgb = s.rgb, pix
	}
	if cr.cropped() {
		pix, w, h = cropRGB(pix, w, cr, s)
	}
	if fx, fy := reduceFactors(w, h, g.rw, g.rh); p.cfg.Decode == DecodeReduce && fx*fy > 1 {
		s.red, s.redAcc, w, h = boxReduce(pix, w, h, fx, fy, s.redAcc, s.red)
		pix = s.red
	}
	s.out = grow(s.out, 3*g.ow*g.oh)
	s.res.resize(pix, w, h, g, p.kern, s.out)
	if cr.Flip {
		flipRGB(s.out, g.ow, g.oh)
	}
	img = Image{
		DType:     p.cfg.DType,
		Shape:     [3]int{3, g.oh, g.ow},
		Grid:      [2]int{g.oh / p.cfg.PatchSize, g.ow / p.cfg.PatchSize},
		Mean:      p.mean,
		Std:       p.std,
		SrcWidth:  hdr.Width,
		SrcHeight: hdr.Height,
		Format:    hdr.Format,
		Crop:      cr,
	}
	img.Complexity, s.cplx = pixelComplexity(s.out, g.ow, g.oh, s.cplx)
	if IsJPEGWire(p.cfg.DType) {
		return p.wireEncode(img, s.out)
	}
	n := 3 * g.ow * g.oh * p.cfg.ElemSize()
	if cap(dst) >= n {
		img.Data = dst[:n]
	} else {
		img.Data = make([]byte, n)
	}
	p.norm.encode(s.out, g.ow, g.oh, img.Data)
	return img, nil
}

// checkedHeader reads data's header after the size limits: the file's bytes,
// then its pixels.
func (p *Processor) checkedHeader(data []byte) (Header, error) {
	if len(data) == 0 {
		return Header{}, ErrEmpty
	}
	if len(data) > p.cfg.MaxFileBytes {
		return Header{}, fmt.Errorf("imgproc: %d bytes > limit %d: %w", len(data), p.cfg.MaxFileBytes, ErrTooLarge)
	}
	hdr, err := ReadHeader(data)
	if err != nil {
		return Header{}, err
	}
	if hdr.Width > p.cfg.MaxImagePixels/hdr.Height {
		return Header{}, fmt.Errorf("imgproc: %s %dx%d > %d pixels: %w", hdr.Format, hdr.Width, hdr.Height, p.cfg.MaxImagePixels, ErrTooLarge)
	}
	return hdr, nil
}

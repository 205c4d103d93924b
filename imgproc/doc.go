// Package imgproc turns untrusted encoded image bytes into fixed-layout
// tensors for vision encoders, and estimates image complexity for the
// balancer.
//
// Inputs: the bytes of one image file. The format is sniffed from the
// content (JPEG baseline/progressive, PNG 1-16 bit incl. palette and alpha,
// GIF first frame, WebP lossy/lossless, BMP, TIFF first page); the file name
// or extension is never trusted.
//
// Pipeline (Processor.Process): size limits from the header (MaxFileBytes,
// then MaxImagePixels before any pixel buffer exists) → decode → packed
// 8-bit RGB (gray, palette, CMYK/YCCK and 16-bit converted; alpha composited
// over Config.Background) → EXIF orientation (Pillow's exif_transpose) →
// resize by policy (shorter-crop, square, dynamic) with Pillow's
// antialiased bilinear or bicubic resampler, reproduced in fixed point →
// centre crop → (x/255-mean)/std in float32, encoded as float16, float32,
// bfloat16, or raw uint8.
//
// Outputs: Image.Data is a CHW tensor ([3][H][W]), little-endian, owned by
// the caller; Image also carries the shape, the patch grid (image tokens),
// the normalization parameters (needed for uint8 output), the pixel
// complexity in [0, 1], and the source's display size and format.
// ReadHeader, Config.OutputSize/ImageTokens and HeaderComplexity give the
// planner what it needs without decoding.
//
// JPEG wire dtypes (wire.go; opt-in and lossy): DTypeJPEG encodes the resized RGB
// pixels (the uint8 tensor's) as a baseline JPEG (Image.Data is the JPEG, Shape its size);
// DTypeJPEGSource returns an acceptable source JPEG's own bytes without
// decoding it (Image.Source true, Shape the planned size; SourceJPEGAcceptable
// says which) and encodes any other source like DTypeJPEG.
//
// Errors: every failure wraps one of ErrEmpty, ErrTooLarge, ErrUnsupported,
// ErrCorrupt (ErrConfig for configuration); decoder panics are recovered as
// ErrCorrupt. Nothing here panics on bad input.
//
// Concurrency: a Processor is immutable after NewProcessor and safe for
// concurrent use; per-call scratch buffers come from a sync.Pool. Run one
// goroutine per core for throughput; each call is single-threaded.
//
// Augmentation: Config.Augment (ParseAugment: "rrc,hflip", see docs/augment.md) is
// applied only by ProcessSample, with the sample's parameters drawn from a generator the
// caller gives (Augment.Sample: torchvision's RandomResizedCrop.get_params and a flip
// draw, from the header size alone): crop, resize the box (AugmentedSize: Size×Size, or
// the dynamic resize of the box), flip. On the exact decode path the result equals
// torchvision's resized_crop + hflip on the same PIL image, bit for bit. Process and
// ProcessInto ignore Config.Augment.
//
// Decoding: Config.Decode DecodeExact (default) decodes every image at full size, so
// tensors are bit-identical to Pillow/torchvision; DecodeFast lets the libjpeg-turbo
// build decode JPEGs scaled by 1/2, 1/4 or 1/8 in the DCT domain with Pillow's draft()
// rule (Config.JPEGDraftGap), trading a measured PSNR (docs/imgproc.md) for speed;
// DecodeReduce (reduce.go), meant for the JPEG wire dtypes, decodes JPEGs at the smallest
// n/8 DCT scale still at least JPEGDraftGap times the resize target and box-reduces any
// decoded image more than twice the target (Pillow's reducing_gap 2) before the resize:
// lossy, with its PSNR against DecodeExact measured in docs/imgproc.md.
//
// Build: the default build is pure Go. With the build tag turbojpeg3 (cgo and the
// libjpeg-turbo 3.x static library that scripts/build-libjpeg-turbo.sh builds into
// build/libjpeg-turbo) or turbojpeg (cgo and the system's libturbojpeg, Debian
// libturbojpeg0-dev), JPEGs decode through libjpeg-turbo, which is what Pillow does
// too; other formats always use the Go decoders. JPEGLibrary names the decoder.
package imgproc

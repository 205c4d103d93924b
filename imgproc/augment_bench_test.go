package imgproc

import (
	"bytes"
	"image/jpeg"
	"testing"
)

// BenchmarkProcessSample compares one 640×480 JPEG through shorter-crop 224
// float16 without augmentation (Process) and with rrc,hflip (ProcessSample):
// the crop decodes the same full image and resizes a smaller box. cpu-ns/op
// is the process's CPU time per image, steadier than ns/op on a busy machine.
func BenchmarkProcessSample(b *testing.B) {
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, photoLike(640, 480), &jpeg.Options{Quality: 90}); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	c := DefaultConfig()
	c.Augment = Augment{RRC: true, Scale: DefaultScale, Ratio: DefaultRatio, FlipP: 0.5}
	p, err := NewProcessor(c)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, p.TensorBytes(640, 480))
	b.Run("augment=none", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		t0 := cpuTime()
		for b.Loop() {
			if _, err := p.ProcessInto(dst, data); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime()-t0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("augment=rrc,hflip", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		r := &splitmix{}
		t0 := cpuTime()
		for b.Loop() {
			if _, err := p.ProcessSample(dst, data, r); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime()-t0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}

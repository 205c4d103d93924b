package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mmfeed/mmfeed/proto"
	"github.com/mmfeed/mmfeed/tokenize"
)

// maxInspectMP bounds the model-parallel ranks ReadStreamStep looks at.
const maxInspectMP = 8

// ReadStreamStep reads the micro-batches of (epoch, step) for dp rank dp from
// a running job's stream, without taking them: it fetches stored messages by
// sequence (JetStream "get message"), creates no consumer and acknowledges
// nothing, so the rank still receives every batch. It reads every mp rank
// of the dp rank it finds and merges them by sample id (under modality
// placement, pixels come from one mp rank and captions from another).
//
// It needs a job served with --data-plane jetstream; on the core data plane
// (the default) ReadServiceStep asks the service instead. Only batches still
// in the stream can be read: published and not yet acknowledged by the rank.
// A step the trainer already took, or that the service has not published
// yet, gives ErrNoStep.
func ReadStreamStep(ctx context.Context, js jetstream.JetStream, job string, epoch, step, dp int, tk *tokenize.Tokenizer) ([]SheetSample, error) {
	stream, err := js.Stream(ctx, proto.StreamName(job))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("pipeline: inspect job %q: no service answers viewer fetches (core data plane) "+
			"and there is no stream %s (jetstream data plane): the job is not running, or the rank does not exist: %w",
			job, proto.StreamName(job), err)
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: inspect job %q: %w", job, err)
	}
	var m sheetMerge
	for mp := range maxInspectMP {
		rows, err := streamRankStep(ctx, stream, job, epoch, step, dp, mp)
		if err != nil {
			return nil, err
		}
		if err := m.add(rows, tk); err != nil {
			return nil, err
		}
	}
	out := m.out
	if len(out) == 0 {
		return nil, fmt.Errorf("job %s epoch %d step %d dp rank %d: not in the stream (taken by the trainer, or not published yet): %w",
			job, epoch, step, dp, ErrNoStep)
	}
	return out, nil
}

// sheetMerge merges the rows of a dp rank's mp ranks by sample id and
// micro-batch (under modality placement, pixels come from one mp rank and
// captions from another).
type sheetMerge struct {
	out   []SheetSample
	index map[string]int
}

func (m *sheetMerge) add(rows []streamRow, tk *tokenize.Tokenizer) error {
	if m.index == nil {
		m.index = map[string]int{}
	}
	for _, r := range rows {
		k := r.ID + "\x00" + fmt.Sprint(r.MicroBatch)
		i, ok := m.index[k]
		if !ok {
			i = len(m.out)
			m.index[k] = i
			m.out = append(m.out, r.SheetSample)
		}
		if r.Image != nil {
			m.out[i].Image = r.Image
		}
		if tk != nil && m.out[i].Caption == "" && len(r.ids) > 0 {
			var err error
			if m.out[i].Caption, err = tk.Decode(r.ids); err != nil {
				return err
			}
		}
	}
	return nil
}

type streamRow struct {
	SheetSample
	ids []int32
}

// streamRankStep reassembles the stored batches of one (dp, mp) rank and
// keeps the rows of (epoch, step), in micro-batch order.
func streamRankStep(ctx context.Context, stream jetstream.Stream, job string, epoch, step, dp, mp int) ([]streamRow, error) {
	subj, err := proto.BatchSubject(job, dp, mp)
	if err != nil {
		return nil, err
	}
	ra, err := proto.NewReassembler[struct{}](proto.DefaultReassemblerConfig())
	if err != nil {
		return nil, err
	}
	var out []streamRow
	for seq := uint64(1); ; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("pipeline: inspect %s: %w", subj, err)
		}
		seq = m.Sequence + 1
		h, err := proto.ParseChunkHeader(m.Header)
		if err != nil || h.Epoch != epoch || h.Step != step {
			continue // another step (or a message this reader does not understand)
		}
		a, err := ra.Add(m.Header, m.Data, struct{}{})
		if err != nil || a == nil || a.Payload == nil {
			continue
		}
		rows, err := decodeStreamBatch(a.Payload, a.Header.MicroBatch)
		if err != nil {
			return nil, fmt.Errorf("pipeline: inspect %s step %d: %w", subj, step, err)
		}
		out = append(out, rows...)
	}
}

func decodeStreamBatch(payload []byte, microBatch int) ([]streamRow, error) {
	rec, err := proto.DecodeIPC(memory.NewGoAllocator(), payload)
	if err != nil {
		return nil, err
	}
	defer rec.Release()
	meta, rows, err := proto.ReadRows(rec)
	if err != nil {
		return nil, err
	}
	var out []streamRow
	for _, row := range rows {
		s := streamRow{SheetSample: SheetSample{MicroBatch: microBatch, ID: row.ID, TextTokens: int(row.TextTokens),
			ImageTokens: int(row.ImageTokens), Cost: row.Cost, Weight: row.Weight}, ids: row.InputIDs}
		if len(row.Pixels) > 0 {
			if s.Image, err = TensorImage(meta, row); err != nil {
				return nil, fmt.Errorf("sample %s: %w", row.ID, err)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

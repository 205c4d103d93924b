package proto

import (
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
)

// ShardFileName returns the conventional shard file name of one (epoch, dp
// rank, mp rank): <job>-e<epoch>-dp<dp>-mp<mp>.arrow.
func ShardFileName(job string, epoch, dp, mp int) string {
	return fmt.Sprintf("%s-e%d-dp%d-mp%d.arrow", job, epoch, dp, mp)
}

// ShardWriter writes the micro-batches of one (epoch, dp rank, mp rank) as an
// Arrow IPC file: one record batch per micro-batch, all with the schema of
// the BatchMeta it was opened with. Not safe for concurrent use.
type ShardWriter struct {
	w      *ipc.FileWriter
	schema *arrow.Schema
	n      int
}

// NewShardWriter starts an IPC file on w for records built with meta (its
// Step and MicroBatch are ignored: they are columns). Close finishes it.
func NewShardWriter(w io.Writer, meta BatchMeta) (*ShardWriter, error) {
	schema, err := Schema(meta)
	if err != nil {
		return nil, err
	}
	fw, err := ipc.NewFileWriter(w, ipc.WithSchema(schema))
	if err != nil {
		return nil, fmt.Errorf("proto: shard writer: %w", err)
	}
	return &ShardWriter{w: fw, schema: schema}, nil
}

// Write appends one micro-batch record. Its schema (metadata included) must
// equal the shard's: same job, epoch, ranks, modality and pixel encoding.
func (s *ShardWriter) Write(rec arrow.RecordBatch) error {
	if !rec.Schema().Equal(s.schema) || !rec.Schema().Metadata().Equal(s.schema.Metadata()) {
		return fmt.Errorf("proto: shard writer: record %d schema %v differs from shard schema %v: %w", s.n, rec.Schema(), s.schema, ErrSchema)
	}
	for i := range s.schema.NumFields() {
		if !rec.Schema().Field(i).Metadata.Equal(s.schema.Field(i).Metadata) {
			return fmt.Errorf("proto: shard writer: record %d column %s metadata differs: %w", s.n, s.schema.Field(i).Name, ErrSchema)
		}
	}
	if err := s.w.Write(rec); err != nil {
		return fmt.Errorf("proto: shard writer: record %d: %w", s.n, err)
	}
	s.n++
	return nil
}

// Records returns the number of records written.
func (s *ShardWriter) Records() int { return s.n }

// Close writes the file footer. It does not close the underlying writer.
func (s *ShardWriter) Close() error {
	if err := s.w.Close(); err != nil {
		return fmt.Errorf("proto: shard writer: close: %w", err)
	}
	return nil
}

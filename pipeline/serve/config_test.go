package serve

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
)

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Job, c.Pipeline.Input = "job-1", "data.jsonl"
		return c
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" valid
	}{
		{"default", func(*Config) {}, ""},
		{"job name", func(c *Config) { c.Job = "a.b" }, "job name"},
		{"no input", func(c *Config) { c.Pipeline.Input = "" }, "no input"},
		{"epochs", func(c *Config) { c.Epochs = 0 }, "epochs 0"},
		{"modality mp", func(c *Config) { c.Pipeline.Plan.Placement = balancer.Modality }, "placement modality needs mp=2"},
		{"modality ok", func(c *Config) { c.Pipeline.Plan.Placement, c.MP = balancer.Modality, 2 }, ""},
		{"stream bytes", func(c *Config) { c.StreamMaxBytes = 0 }, "stream max bytes"},
		{"replicas", func(c *Config) { c.Replicas = 6 }, "replicas 6"},
		{"ack pending", func(c *Config) { c.MaxAckPending = 0 }, "max ack pending"},
		{"recalibrate", func(c *Config) { c.Recalibrate = -2 }, "recalibrate -2"},
		{"observations", func(c *Config) { c.MinObservations = 3 }, "min observations"},
		{"token without http", func(c *Config) { c.HTTPToken = "x" }, "HTTP token without"},
		{"http addr", func(c *Config) { c.HTTP = "nope" }, "http address"},
		{"payload", func(c *Config) { c.NATS.MaxPayload = 1000 }, "max payload"},
		{"listen", func(c *Config) { c.NATS.Listen = "127.0.0.1:99999" }, "listen port"},
		{"auth embedded", func(c *Config) { c.NATS.Token = "t" }, "external deployment"},
		{"two auth", func(c *Config) { c.NATS.URLs, c.NATS.Token, c.NATS.CredsFile = []string{"nats://x:4222"}, "t", "f" }, "more than one"},
		{"tls half", func(c *Config) { c.NATS.URLs, c.NATS.TLSCert = []string{"nats://x:4222"}, "c.pem" }, "both cert and key"},
		{"external", func(c *Config) { c.NATS.URLs, c.NATS.User, c.NATS.Password = []string{"nats://x:4222"}, "u", "p" }, ""},
		{"publisher", func(c *Config) { c.Publisher.Window = 0 }, "publisher config"},
		{"register wait", func(c *Config) { c.RegisterWait = -time.Second }, "register wait"},
		{"role", func(c *Config) { c.Role = "boss" }, `role "boss"`},
		{"role worker", func(c *Config) { c.Role = RoleWorker }, "runs RunWorker"},
		{"local workers without planner", func(c *Config) { c.LocalWorkers = 2 }, "local workers 2"},
		{"planner unreachable", func(c *Config) { c.Role, c.NATS.Listen = RolePlanner, "" }, "no worker can reach"},
		{"planner local", func(c *Config) { c.Role, c.NATS.Listen, c.LocalWorkers = RolePlanner, "", 1 }, ""},
		{"planner listening", func(c *Config) { c.Role, c.NATS.Listen = RolePlanner, "127.0.0.1:0" }, ""},
		{"work ack wait", func(c *Config) { c.Role, c.LocalWorkers, c.WorkAckWait = RolePlanner, 1, time.Millisecond }, "work ack wait"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want valid", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestJobRecordCompatible(t *testing.T) {
	c := DefaultConfig()
	c.Job, c.Pipeline.Input = "job-1", "data.jsonl"
	rec, err := c.jobRecord()
	if err != nil {
		t.Fatal(err)
	}
	again, _ := c.jobRecord()
	if err := rec.compatible(again); err != nil {
		t.Errorf("the same config: %v", err)
	}
	more := c
	more.Epochs = 5 // extending a job is allowed
	if r, _ := more.jobRecord(); rec.compatible(r) != nil {
		t.Errorf("more epochs refused")
	}
	for name, edit := range map[string]func(*Config){
		"dp":    func(c *Config) { c.Pipeline.Plan.DP = 4 },
		"seed":  func(c *Config) { c.Pipeline.Plan.Seed = 9 },
		"image": func(c *Config) { c.Pipeline.Image.Size = 64 },
		"input": func(c *Config) { c.Pipeline.Input = "other.jsonl" },
	} {
		d := c
		edit(&d)
		r, _ := d.jobRecord()
		if err := rec.compatible(r); !errors.Is(err, ErrJobMismatch) {
			t.Errorf("%s changed: got %v, want ErrJobMismatch", name, err)
		}
	}
}

func TestReplyPrefix(t *testing.T) {
	for reply, want := range map[string]string{"_INBOX.abc.7": "_INBOX.abc", "_INBOX.x": "_INBOX", "": "", "nodot": ""} {
		if got := natsenv.ReplyPrefix(reply); got != want {
			t.Errorf("ReplyPrefix(%q) = %q, want %q", reply, got, want)
		}
	}
}

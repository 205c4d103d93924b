package tokenize

import "testing"

func TestDecodeRoundTrip(t *testing.T) {
	tk, err := Open(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Close()
	tests := []struct{ text, want string }{
		{"A wide green picture.", "a wide green picture."},
		{"", ""},
	}
	for _, tt := range tests {
		ids, err := tk.Encode(tt.text)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tk.Decode(append(ids, -1, 1<<30)) // out-of-vocabulary ids are dropped
		if err != nil || got != tt.want {
			t.Errorf("Decode(Encode(%q)) = %q, %v; want %q", tt.text, got, err, tt.want)
		}
	}
	tk.Close()
	if _, err := tk.Decode([]int32{1}); err != ErrClosed {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

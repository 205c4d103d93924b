package main

import "testing"

func TestJPEGLibraryVersion(t *testing.T) {
	for _, tt := range []struct {
		lib  string
		want float64
	}{
		{"libjpeg-turbo 3.1.2", 3001002},
		{"libjpeg-turbo 2.1.5", 2001005},
		{"Go image/jpeg", 0},
		{"libjpeg-turbo x.1", 0},
	} {
		if got := jpegLibraryVersion(tt.lib); got != tt.want {
			t.Errorf("jpegLibraryVersion(%q) = %v, want %v", tt.lib, got, tt.want)
		}
	}
}

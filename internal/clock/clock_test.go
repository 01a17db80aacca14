package clock

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestNilIsRealTime(t *testing.T) {
	if Param(nil) != nil {
		t.Fatal("a nil clock gives the statements a time: they would not use the database's now()")
	}
	before := time.Now()
	if got := Now(nil); got.Before(before) || got.After(time.Now()) {
		t.Fatalf("Now(nil) = %v, not the real time", got)
	}
}

func TestStub(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	s := NewStub(start)
	var woken atomic.Int32
	s.OnChange(func() { woken.Add(1) })
	want := start.UTC().Truncate(time.Microsecond)
	if got := s.Now(); !got.Equal(want) || got.Location() != time.UTC {
		t.Fatalf("Now = %v, want %v in UTC", got, want)
	}
	if p := Param(s); p == nil || !p.Equal(want) {
		t.Fatalf("Param = %v, want %v", p, want)
	}
	if got := Now(s); !got.Equal(want) {
		t.Fatalf("Now(stub) = %v", got)
	}
	if got := s.Advance(time.Hour); !got.Equal(want.Add(time.Hour)) || !s.Now().Equal(got) {
		t.Fatalf("Advance: %v, Now %v", got, s.Now())
	}
	s.Set(start)
	if !s.Now().Equal(want) || woken.Load() != 2 {
		t.Fatalf("after Set: %v, hooks ran %d times (want 2)", s.Now(), woken.Load())
	}
	var _ Notifier = s
}

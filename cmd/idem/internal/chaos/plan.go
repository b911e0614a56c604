package chaos

import (
	"encoding/binary"
	"hash/fnv"
	"math"
)

// injectTransient decides, from the seed and the event id alone, whether the handler fails
// the event's first attempt: every consumer process, restarted or not, decides the same.
func injectTransient(seed int64, rate float64, eventID string) bool {
	if rate <= 0 {
		return false
	}
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(seed))
	h.Write(b[:])
	h.Write([]byte(eventID))
	// FNV mixes the last bytes of similar ids poorly into the high bits: finish with
	// SplitMix64's finalizer so the fraction is uniform.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11)/float64(uint64(1)<<53) < math.Min(rate, 1)
}

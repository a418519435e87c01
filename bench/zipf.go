package bench

import "math"

// zipfCDF returns cumulative weights 1/(k+1)^s for k in [0, n). math/rand's
// Zipf is not used because it needs one *rand.Rand per generator and its
// (s, v) parameterisation makes the skew harder to state in the report.
func zipfCDF(s float64, n int) []float64 {
	cdf := make([]float64, n)
	sum := 0.0
	for i := 0; i < n; i++ {
		sum += 1 / math.Pow(float64(i+1), s)
		cdf[i] = sum
	}
	return cdf
}

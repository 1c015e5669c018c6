// Package response is the one place that turns a limitplane Decision (or an
// authentication or engine error) into an HTTP status, header fields and a
// JSON body. Every adapter — net/http, Gin, Fiber, gRPC metadata — renders
// through it, so all of them answer byte for byte the same.
//
// Header fields follow the IETF httpapi draft "RateLimit header fields for
// HTTP" (draft-ietf-httpapi-ratelimit-headers-10, structured-field form):
//
//	RateLimit-Policy: "default";q=5;w=1, "default/quota";q=100;w=86400
//	RateLimit: "default";r=4;t=1, "default/quota";r=99;t=86400
//
// One item per configured limit: the rate limit is named after its policy,
// the quota after its policy with "/quota" appended. For a GCRA rate limit
// q is the burst and w is the burst tolerance τ = Burst×T (the time a full
// burst takes to refill), in whole seconds rounded up; for a quota q is Max
// and w the renewal period. r is the remaining count. t is the whole seconds
// (rounded up) until the limit resets, or, on a denied request, the
// Retry-After value, so Retry-After is never earlier than t.
//
// Optionally (Options.XRateLimit) the de-facto fields GitHub and Tyk
// clients read are added for the deciding limit: X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset, the latter in Unix epoch
// seconds by default (as GitHub and Tyk send it) or in seconds from now.
package response

import (
	"context"
	"errors"
	"hash/maphash"
	"math/bits"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// MessageInFlight is the error of a request refused by an in-flight limit
// (core.KindInFlight): 429 with the body {"error":"too many concurrent
// requests"}, no Retry-After and no rate-limit fields (a cap on
// concurrent requests has no window or reset time to state; see
// Renderer.Render).
const MessageInFlight = "too many concurrent requests"

// StatusClientClosedRequest (499, nginx's "client closed request") is the
// status of a request whose decision ended because its context was
// canceled, a client that went away while the store was deciding
// (core.Options.OnStoreError): no client reads it, but logs and metrics
// tell it from a store failure.
const StatusClientClosedRequest = 499

// Header field names, in Go's canonical form.
const (
	HeaderPolicy     = "Ratelimit-Policy"
	HeaderRateLimit  = "Ratelimit"
	HeaderRetryAfter = "Retry-After"
	HeaderXLimit     = "X-Ratelimit-Limit"
	HeaderXRemaining = "X-Ratelimit-Remaining"
	HeaderXReset     = "X-Ratelimit-Reset"
)

// ResetFormat selects how X-RateLimit-Reset is written.
type ResetFormat uint8

const (
	// ResetEpoch writes the Unix time, in seconds, at which the limit
	// resets (GitHub, Tyk). The default.
	ResetEpoch ResetFormat = iota
	// ResetSeconds writes the seconds from now until the limit resets.
	ResetSeconds
)

// Options configure a Renderer. The zero value sends the IETF fields only,
// answers quota exhaustion with 429 and store failure with 503.
type Options struct {
	// XRateLimit adds X-RateLimit-Limit, -Remaining and -Reset.
	XRateLimit bool
	// XRateLimitReset selects the X-RateLimit-Reset format.
	XRateLimitReset ResetFormat
	// NoRateLimitFields leaves out the IETF RateLimit-Policy and RateLimit
	// fields.
	NoRateLimitFields bool
	// QuotaExceededStatus is the status for a quota denial; default 429
	// (Tyk sends 403).
	QuotaExceededStatus int
	// StoreFailureStatus is the status when the engine fails closed;
	// default 503. It is never 429.
	StoreFailureStatus int
	// Now is the wall clock for epoch resets; default time.Now.
	Now func() time.Time
}

// Header is one response header field.
type Header struct{ Name, Value string }

// Result is what an adapter must send.
type Result struct {
	// Pass is true when the request goes on to the handler; Headers are
	// then still to be set on its response.
	Pass bool
	// Status and Body are the response when Pass is false.
	Status int
	Body   []byte
	// Message is the "error" text of Body, for transports that carry a
	// message rather than a body (gRPC status messages).
	Message string
	// Headers are the fields to set, in order.
	Headers []Header
	// Canonical is true when every name in Headers is in the form
	// net/http and fasthttp normalize names to and no value holds a CR or
	// LF, as in every Result a Renderer returns: an adapter may then set
	// the fields as they are, without normalizing or checking them. A
	// Result built otherwise leaves it false.
	Canonical bool
}

// Renderer renders decisions. It is immutable and safe for concurrent use.
type Renderer struct {
	o Options
	// policies caches RateLimit-Policy values, which change only with the
	// policies themselves: a small direct-mapped, lock-free cache keyed by
	// the fields the value is made of.
	seed     maphash.Seed
	policies [64]atomic.Pointer[policyValue]
	// recent holds the same values by where the names are, which is found
	// without hashing their bytes: a decider hands out the same policy ID
	// strings every time.
	recent [64]atomic.Pointer[policyValue]
}

// policyKey is what a RateLimit-Policy value is made of.
type policyKey struct {
	rateName, quotaName   string
	rateLimit, quotaLimit int64
	rateWin, quotaWin     time.Duration
}

type policyValue struct {
	k policyKey
	v string
	// rateOpen and quotaOpen open each limit's item in a RateLimit value:
	// its name as an sf-string and ";r=" ("" for a limit k has not).
	rateOpen, quotaOpen string
}

// NewRenderer returns a Renderer for o.
func NewRenderer(o Options) *Renderer {
	if o.QuotaExceededStatus == 0 {
		o.QuotaExceededStatus = http.StatusTooManyRequests
	}
	if o.StoreFailureStatus == 0 || o.StoreFailureStatus == http.StatusTooManyRequests {
		o.StoreFailureStatus = http.StatusServiceUnavailable
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Renderer{o: o, seed: maphash.MakeSeed()}
}

// Render returns the answer for a decision d, or for err when it is not nil
// (an authentication error from identity, or an engine error). dst is
// reused for Headers.
//
// An *identity.LimitError (identity.FailureLimited's answer to a client
// over its failed-authentication budget) renders as its denying decision,
// with the body "too many failed authentication attempts".
func (r *Renderer) Render(dst []Header, d core.Decision, err error) Result {
	var res Result
	res.Headers = r.render(&res, dst, nil, &d, err, true)
	return res
}

// Scratch is the memory RenderScratch renders one answer into. Its zero
// value is ready; keep it in a sync.Pool (or on the heap) and reuse it once
// the answer rendered into it has been written.
type Scratch struct {
	headers [8]Header
	text    [128]byte // the values rendered for this answer
	retry   [20]byte  // Retry-After's value
	body    [128]byte
	res     Result // RenderDecision's
}

// RenderScratch is Render with s as its memory, for an adapter whose
// framework copies header values and the body as it sets them (fasthttp):
// the Result's Headers, every value rendered for this answer and its Body
// are in s (or, should one not fit, in memory of its own) and are valid
// only until s is rendered into again. It renders the same answer as
// Render, byte for byte, and allocates nothing when everything fits.
func (r *Renderer) RenderScratch(s *Scratch, d core.Decision, err error) Result {
	var res Result
	res.Headers = r.render(&res, s.headers[:0], s, &d, err, true)
	return res
}

// RenderDecision is RenderScratch of *d with the Result in s too, for an
// adapter that holds the decision in a variable of its own: the same
// answer, without copying the decision (176 bytes) to render it or the
// Result (88) to return it. d is not changed; the Result is valid only
// until s is rendered into again.
func (r *Renderer) RenderDecision(s *Scratch, d *core.Decision, err error) *Result {
	s.res.Headers = r.render(&s.res, s.headers[:0], s, d, err, true)
	return &s.res
}

// RenderMessage is RenderScratch for a transport that carries
// Result.Message instead of a body (gRPC's status message): Body is left
// nil, so nothing is rendered that is not sent. Everything else is
// RenderScratch's answer, byte for byte.
func (r *Renderer) RenderMessage(s *Scratch, d core.Decision, err error) Result {
	var res Result
	res.Headers = r.render(&res, s.headers[:0], s, &d, err, false)
	return res
}

// render is Render into *res, but for its Headers, which it appends to dst
// and returns (so that dst, which may be on the caller's stack, is not
// stored through res); values and body are in s when s is not nil; without
// body, Result.Body is nil. *d is not changed.
func (r *Renderer) render(res *Result, dst []Header, s *Scratch, d *core.Decision, err error, body bool) []Header {
	authLimited := false
	if err != nil {
		// errors.AsType, unlike errors.As, needs no target on the heap.
		le, ok := errors.AsType[*identity.LimitError](err)
		if !ok {
			r.failure(res, s, err, body)
			return dst
		}
		ld := le.Decision
		ld.Allowed = false // never let a LimitError pass
		d, authLimited = &ld, true
	}
	*res = Result{Pass: d.Allowed, Canonical: true}
	hs, retry := r.headers(dst, s, d)
	if d.Allowed {
		return hs
	}
	res.Status = http.StatusTooManyRequests
	if d.DecidedBy == core.KindInFlight && !authLimited {
		// No Retry-After: when a slot frees depends on other requests'
		// responses, which nothing here knows.
		res.Body, res.Message = constBody(s, bodyInFlight, -1), MessageInFlight
		return hs
	}
	msg, open := messageRateLimited, bodyRateLimited
	if d.DecidedBy == core.KindQuota {
		res.Status, msg, open = r.o.QuotaExceededStatus, messageQuotaExceeded, bodyQuotaExceeded
	}
	if d.RetryAfter < 0 {
		never, nbody := messageNeverAllowed, bodyNeverAllowed
		if d.DecidedBy == core.KindQuota {
			never, nbody = messageQuotaNeverAllowed, bodyQuotaNeverAllowed
		}
		res.Message = never
		if body {
			res.Body = constBody(s, nbody, -1)
		}
		return hs
	}
	if authLimited {
		msg = identity.ErrTooManyFailures.Error()
		open = ""
	}
	switch {
	case retry != "":
		// The deciding limit's t in RateLimit, the same digits.
	case s != nil:
		b := appendInt(s.retry[:0], ceilSeconds(d.RetryAfter))
		retry = unsafe.String(unsafe.SliceData(b), len(b))
	default:
		retry = strconv.FormatInt(ceilSeconds(d.RetryAfter), 10)
	}
	hs = append(hs, Header{HeaderRetryAfter, retry})
	res.Message = msg
	if body {
		if open != "" {
			res.Body = constBody(s, open, ceilMillis(d.RetryAfter))
		} else {
			res.Body = errorBody(s, msg, ceilMillis(d.RetryAfter))
		}
	}
	return hs
}

// The messages of denials, and the start of their JSON bodies written out
// (errorBody of the message up to its closing quote), so that a denial's
// body is copied rather than escaped byte by byte (TestConstBodies).
const (
	messageRateLimited   = "rate limit exceeded"
	messageQuotaExceeded = "quota exceeded"
	messageNeverAllowed  = "request cost exceeds the burst and can never be allowed"
	// messageQuotaNeverAllowed: a cost above the quota's max (a quota has
	// no burst).
	messageQuotaNeverAllowed = "request cost exceeds the quota and can never be allowed"

	bodyRateLimited       = `{"error":"` + messageRateLimited + `"`
	bodyQuotaExceeded     = `{"error":"` + messageQuotaExceeded + `"`
	bodyNeverAllowed      = `{"error":"` + messageNeverAllowed + `"`
	bodyQuotaNeverAllowed = `{"error":"` + messageQuotaNeverAllowed + `"`
	bodyInFlight          = `{"error":"` + MessageInFlight + `"`
)

// BodyHeaders returns the fields that go with a Body (a Result that does not
// pass): it is JSON, and must not be sniffed as anything else.
func BodyHeaders() [2]Header {
	return [2]Header{{"Content-Type", "application/json"}, {"X-Content-Type-Options", "nosniff"}}
}

// failure is render's answer for an error that is not an
// *identity.LimitError: no fields of its own.
func (r *Renderer) failure(res *Result, s *Scratch, err error, body bool) {
	status, msg := http.StatusInternalServerError, "internal error"
	// errors.AsType, unlike errors.As, needs no target on the heap.
	if ie, ok := errors.AsType[*identity.Error](err); ok {
		status, msg = ie.Status, ie.Reason
	} else if mc, ok := errors.AsType[*core.MalformedCostError](err); ok {
		status, msg = http.StatusBadRequest, mc.Error()
	} else {
		status, msg = r.failureStatus(err, status, msg)
	}
	*res = Result{Status: status, Message: msg, Canonical: true}
	if body {
		res.Body = errorBody(s, msg, -1)
	}
}

// failureStatus is failure's status and message for an engine error:
// status and msg when err is none it knows.
func (r *Renderer) failureStatus(err error, status int, msg string) (int, string) {
	switch {
	case errors.Is(err, core.ErrNoPolicy), errors.Is(err, core.ErrUnknownPolicy):
		status, msg = http.StatusForbidden, "access to this API is not allowed"
	case errors.Is(err, core.ErrStoreUnavailable):
		status, msg = r.o.StoreFailureStatus, "rate limit store unavailable"
	case errors.Is(err, context.Canceled):
		status, msg = StatusClientClosedRequest, "client closed request"
	case errors.Is(err, core.ErrInvalidCost), errors.Is(err, core.ErrCostExceedsBurst):
		status, msg = http.StatusBadRequest, "invalid request cost"
	}
	return status, msg
}

// headers appends the limit fields for d. The values rendered for this
// answer — all but RateLimit-Policy's, which is cached — are written to one
// buffer and share one string: s's, when s is not nil. retry is the
// deciding limit's t in RateLimit when it was written from d.RetryAfter
// (Retry-After's value; "" when not).
func (r *Renderer) headers(dst []Header, s *Scratch, d *core.Decision) (_ []Header, retry string) {
	if d.DecidedBy == core.KindNone || d.DecidedBy == core.KindInFlight || (r.o.NoRateLimitFields && !r.o.XRateLimit) {
		return dst, ""
	}
	var pv *policyValue
	if !r.o.NoRateLimitFields {
		pv = r.policy(d)
		dst = append(dst, Header{HeaderPolicy, pv.v})
	}
	// Two buffers, each its own variable, so that the stack one, whose
	// bytes are copied, never reaches the heap.
	var vals string
	var cur, limit, remaining, retryAt int
	if s != nil {
		var b []byte
		b, cur, limit, remaining, retryAt = r.values(s.text[:0], d, pv)
		vals = unsafe.String(unsafe.SliceData(b), len(b))
	} else {
		var bb [128]byte
		var b []byte
		b, cur, limit, remaining, retryAt = r.values(bb[:0], d, pv)
		vals = string(b)
	}
	if retryAt > 0 {
		retry = vals[retryAt:cur]
	}
	if !r.o.NoRateLimitFields {
		dst = append(dst, Header{HeaderRateLimit, vals[:cur]})
	}
	if r.o.XRateLimit {
		dst = append(dst,
			Header{HeaderXLimit, vals[cur:limit]},
			Header{HeaderXRemaining, vals[limit:remaining]},
			Header{HeaderXReset, vals[remaining:]})
	}
	return dst, retry
}

// values appends the values rendered for d to buf: the RateLimit value
// ends at cur, X-RateLimit-Limit's at limit and X-RateLimit-Remaining's at
// remaining; X-RateLimit-Reset's follows. pv is d's RateLimit-Policy
// value, whose items open RateLimit's (nil with NoRateLimitFields).
// When the last item's t is the deciding limit's Retry-After, it starts
// at retryAt (else 0) and ends at cur.
func (r *Renderer) values(buf []byte, d *core.Decision, pv *policyValue) (_ []byte, cur, limit, remaining, retryAt int) {
	if !r.o.NoRateLimitFields {
		deciding := func(k core.Kind) bool { return !d.Allowed && d.DecidedBy == k && d.RetryAfter >= 0 }
		if d.Rate.Limit > 0 {
			buf, retryAt = current(buf, &d.Rate, pv.rateOpen, deciding(core.KindRate), d.RetryAfter)
		}
		if d.Quota.Limit > 0 {
			buf, retryAt = current(buf, &d.Quota, pv.quotaOpen, deciding(core.KindQuota), d.RetryAfter)
		}
	}
	cur = len(buf)
	limit, remaining = cur, cur
	if r.o.XRateLimit {
		reset := ceilSeconds(d.ResetAfter)
		if !d.Allowed && d.RetryAfter > d.ResetAfter {
			reset = ceilSeconds(d.RetryAfter)
		}
		if r.o.XRateLimitReset == ResetEpoch {
			reset += r.o.Now().Unix()
		}
		buf = appendInt(buf, d.Limit)
		limit = len(buf)
		buf = appendInt(buf, d.Remaining)
		remaining = len(buf)
		buf = appendInt(buf, reset)
	}
	return buf, cur, limit, remaining, retryAt
}

// policy returns the RateLimit-Policy value for d, from the cache when
// the same policies were rendered before.
func (r *Renderer) policy(d *core.Decision) *policyValue {
	var k policyKey
	if d.Rate.Limit > 0 {
		k.rateName, k.rateLimit, k.rateWin = d.Rate.Policy, d.Rate.Limit, d.Rate.Window
	}
	if d.Quota.Limit > 0 {
		k.quotaName, k.quotaLimit, k.quotaWin = d.Quota.Policy, d.Quota.Limit, d.Quota.Window
	}
	near := &r.recent[k.near()%uint64(len(r.recent))]
	if pv := near.Load(); pv != nil && pv.k == k {
		return pv
	}
	slot := &r.policies[maphash.Comparable(r.seed, k)%uint64(len(r.policies))]
	if pv := slot.Load(); pv != nil && pv.k == k {
		near.Store(pv)
		return pv
	}
	var buf [128]byte
	pol := buf[:0]
	if k.rateLimit > 0 {
		pol = policyItem(pol, k.rateName, "", k.rateLimit, k.rateWin)
	}
	if k.quotaLimit > 0 {
		pol = policyItem(pol, k.quotaName, "/quota", k.quotaLimit, k.quotaWin)
	}
	pv := &policyValue{k: k, v: string(pol)}
	if k.rateLimit > 0 {
		pv.rateOpen = itemOpen(k.rateName, "")
	}
	if k.quotaLimit > 0 {
		pv.quotaOpen = itemOpen(k.quotaName, "/quota")
	}
	slot.Store(pv)
	near.Store(pv)
	return pv
}

// itemOpen is how a limit's item in a RateLimit list opens: its name as
// an sf-string and ";r=".
func itemOpen(name, suffix string) string {
	if name == "" {
		name = "limit"
	}
	return string(append(appendSFString(nil, name, suffix), ";r="...))
}

// near mixes the addresses of k's names and its numbers: where to look
// for k in Renderer.recent. Equal keys may mix differently (names with
// the same bytes elsewhere); the entry found is compared in full.
func (k *policyKey) near() uint64 {
	const m = 0x9e3779b97f4a7c15
	h := uint64(uintptr(unsafe.Pointer(unsafe.StringData(k.rateName))))
	h = (h^uint64(uintptr(unsafe.Pointer(unsafe.StringData(k.quotaName)))))*m ^ uint64(k.rateLimit)
	h = (h*m ^ uint64(k.quotaLimit)) * m
	h = (h ^ uint64(k.rateWin) ^ uint64(k.quotaWin)<<7) * m
	return h >> 32
}

// policyItem appends one policy to a RateLimit-Policy list.
func policyItem(pol []byte, name, suffix string, limit int64, window time.Duration) []byte {
	if len(pol) > 0 {
		pol = append(pol, ", "...)
	}
	if name == "" {
		name = "limit"
	}
	pol = appendSFString(pol, name, suffix)
	pol = append(pol, ";q="...)
	pol = strconv.AppendInt(pol, limit, 10)
	pol = append(pol, ";w="...)
	return strconv.AppendInt(pol, max(ceilSeconds(window), 1), 10)
}

// current appends one policy's state to a RateLimit list; open is its
// item's opening (itemOpen). For the deciding limit of a denial with a
// Retry-After (retry ≥ 0), t is Retry-After's value and retryAt where it
// starts; else retryAt is 0.
func current(cur []byte, s *core.Status, open string, deciding bool, retry time.Duration) (_ []byte, retryAt int) {
	if len(cur) > 0 {
		cur = append(cur, ", "...)
	}
	t := ceilSeconds(s.ResetAfter)
	if deciding {
		t = ceilSeconds(retry)
	}
	cur = append(cur, open...)
	cur = appendInt(cur, s.Remaining)
	cur = append(cur, ";t="...)
	if deciding {
		retryAt = len(cur)
	}
	return appendInt(cur, t), retryAt
}

// appendInt is strconv.AppendInt(b, v, 10), writing the digits of a
// number of 3 digits or more straight into b (when it has room) rather
// than into a buffer of their own and then copied.
func appendInt(b []byte, v int64) []byte {
	if v < 0 || v >= 1e18 {
		return strconv.AppendInt(b, v, 10)
	}
	u := uint64(v)
	if u < 10 {
		return append(b, byte('0'+u))
	}
	if u < 100 {
		return append(b, digitPairs[2*u], digitPairs[2*u+1])
	}
	// n, the number of digits: bits.Len64(u)·log10(2), rounded up or one
	// too many, which the comparison with the power of ten corrects.
	n := int(uint(bits.Len64(u))*1233>>12) + 1
	if u < pow10[n-1] {
		n--
	}
	l := len(b)
	if cap(b)-l < n {
		return strconv.AppendInt(b, v, 10)
	}
	b = b[:l+n]
	d := b[l:]
	i := n
	for u >= 100 {
		q := u / 100
		j := 2 * (u - 100*q)
		i -= 2
		d[i], d[i+1] = digitPairs[j], digitPairs[j+1]
		u = q
	}
	if u >= 10 {
		d[0], d[1] = digitPairs[2*u], digitPairs[2*u+1]
	} else {
		d[0] = byte('0' + u)
	}
	return b
}

// digitPairs are the numbers 00 to 99, two digits each.
const digitPairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"

// pow10[i] is 10^i, up to 10^18.
var pow10 = [19]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
	1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18}

// appendSFString appends name+suffix as an RFC 8941 sf-string: printable
// ASCII only (others become '_'), with '"' and '\' escaped.
func appendSFString(b []byte, name, suffix string) []byte {
	b = append(b, '"')
	for _, s := range [2]string{name, suffix} {
		for i := 0; i < len(s); i++ {
			c := s[i]
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c > 0x7e:
				b = append(b, '_')
			default:
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}

// errorBody returns {"error":msg} plus "retry_after_ms" when ms ≥ 0, in
// s's body when s is not nil.
func errorBody(s *Scratch, msg string, ms int64) []byte {
	var b []byte
	if s != nil {
		b = s.body[:0]
	} else {
		b = make([]byte, 0, len(msg)+48)
	}
	b = append(b, `{"error":"`...)
	for i := 0; i < len(msg); i++ {
		switch c := msg[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		default:
			b = append(b, c)
		}
	}
	b = append(b, '"')
	return closeBody(b, ms)
}

// constBody is errorBody of a message whose body up to its closing quote
// is open (one of the body constants): the same bytes, copied.
func constBody(s *Scratch, open string, ms int64) []byte {
	var b []byte
	if s != nil {
		b = s.body[:0]
	} else {
		b = make([]byte, 0, len(open)+40)
	}
	return closeBody(append(b, open...), ms)
}

// closeBody ends a JSON error body: "retry_after_ms" when ms ≥ 0, the
// closing brace and a newline.
func closeBody(b []byte, ms int64) []byte {
	if ms >= 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = appendInt(b, ms)
	}
	return append(b, '}', '\n')
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

package adapters

// Answer floors: what writing a row's answer costs on its own. A
// middleware's added time in the peers benchmarks is its own work (finding
// the client, deciding, rendering) plus what its answer costs the writer
// and the server: each header field it sets is a map insert into the
// request's fresh header map, and a bigger map for the server to copy
// (ResponseRecorder and net/http's response both clone it on WriteHeader)
// and serialize. The "answer:" rows replay, with no limiting at all, the
// exact answer a row gives (its header fields, and for a denial its status
// and body), captured from the row itself: the least any middleware pays
// to send that answer. row − answer:row is the row's own work.

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// answer is what a middleware sent for one request: the header fields it
// had set when it called the next handler (pass) or wrote its own status,
// and then that status and body.
type answer struct {
	fields []field
	pass   bool
	status int
	body   []byte
}

// field is one header field of an answer, its values kept as the
// middleware set them.
type field struct {
	name   string
	values []string
}

// captureWriter records into a the fields set before the first
// WriteHeader or Write, the status and the body.
type captureWriter struct {
	http.ResponseWriter
	a *answer
}

func (w *captureWriter) snapshot() {
	if w.a.status != 0 {
		return
	}
	for k, v := range w.Header() {
		w.a.fields = append(w.a.fields, field{k, slices.Clone(v)})
	}
}

func (w *captureWriter) WriteHeader(code int) {
	w.snapshot()
	w.a.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *captureWriter) Write(p []byte) (int, error) {
	if w.a.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.a.body = append(w.a.body, p...)
	return w.ResponseWriter.Write(p)
}

// captureAnswer returns the answer row p gives at r to client 1's second
// request (the first spends denyRate's one request).
func captureAnswer(tb testing.TB, p netHTTPPeer, r peerRate) *answer {
	tb.Helper()
	a := new(answer)
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		a.pass = true
		for k, v := range w.Header() {
			a.fields = append(a.fields, field{k, slices.Clone(v)})
		}
	})
	h := p.wrap(tb, next, r)
	req := httptest.NewRequest("GET", "/x", nil)
	req.RemoteAddr = clientAddr(1).String()
	h.ServeHTTP(httptest.NewRecorder(), req)
	*a = answer{}
	h.ServeHTTP(&captureWriter{httptest.NewRecorder(), a}, req)
	if !a.pass && a.status == 0 {
		tb.Fatalf("%s: neither passed the request on nor answered it", p.name)
	}
	return a
}

// replay is a middleware that sends a, the same for every request: its
// fields set (the captured []string shared, so no value is allocated),
// then next for an answer that passed, else a's status and body.
func replay(a *answer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for _, f := range a.fields {
			h[f.name] = f.values
		}
		if a.pass {
			next.ServeHTTP(w, r)
			return
		}
		w.WriteHeader(a.status)
		w.Write(a.body)
	})
}

// answerRows returns, for each row of peers named in names, the row and
// its answer: row, answer:row, in that order, after peers' bare row;
// serve makes the answer: row's handler from the captured answer.
func answerRows(peers []netHTTPPeer, serve func(a *answer, next http.Handler) http.Handler, names ...string) []netHTTPPeer {
	rows := []netHTTPPeer{peers[0]}
	for _, p := range peers {
		if !slices.Contains(names, p.name) {
			continue
		}
		rows = append(rows, p, netHTTPPeer{"answer:" + p.name, func(tb testing.TB, next http.Handler, r peerRate) http.Handler {
			return serve(captureAnswer(tb, p, r), next)
		}})
	}
	return rows
}

// ginReplay is replay as Gin middleware, in a Gin app as the Gin rows'
// middleware is: it ends the chain (Abort) after an answer of its own.
func ginReplay(a *answer, next http.Handler) http.Handler {
	return ginApp(next, func(c *gin.Context) {
		h := c.Writer.Header()
		for _, f := range a.fields {
			h[f.name] = f.values
		}
		if a.pass {
			c.Next()
			return
		}
		c.Writer.WriteHeader(a.status)
		c.Writer.Write(a.body)
		c.Abort()
	})
}

// answerTables are the answer rows of each framework served as an
// http.Handler: limitplane and the cheapest peer (httprate for net/http in
// almost every round of BenchmarkPeersNetHTTP; ulule's driver, the only
// one, for Gin), each beside the replay of its own answer.
func answerTables() map[string][]netHTTPPeer {
	return map[string][]netHTTPPeer{
		"net/http": answerRows(netHTTPPeers, replay, "limitplane", "httprate"),
		"gin":      answerRows(ginPeers, ginReplay, "limitplane", "ulule"),
	}
}

// BenchmarkPeersNetHTTPAnswers runs answerTables' net/http rows, admitted
// and denied, with the recorder and with the wire writer:
// limitplane − answer:limitplane is limitplane's own work, httprate −
// answer:httprate httprate's.
func BenchmarkPeersNetHTTPAnswers(b *testing.B) { benchAnswers(b, answerTables()["net/http"], true) }

// BenchmarkPeersGinAnswers is BenchmarkPeersNetHTTPAnswers for Gin, with
// the recorder, as BenchmarkPeersGin.
func BenchmarkPeersGinAnswers(b *testing.B) { benchAnswers(b, answerTables()["gin"], false) }

func benchAnswers(b *testing.B, rows []netHTTPPeer, wire bool) {
	for _, rate := range peerRates {
		b.Run(rate.name+"/recorder", func(b *testing.B) {
			benchRows(b, rows, rate.r, func() func(http.Handler, *http.Request) {
				return func(h http.Handler, r *http.Request) { serveRecorded(h, r) }
			})
		})
		if !wire {
			continue
		}
		b.Run(rate.name+"/wire", func(b *testing.B) {
			benchRows(b, rows, rate.r, func() func(http.Handler, *http.Request) {
				w := new(wireWriter)
				return func(h http.Handler, r *http.Request) {
					w.reset()
					h.ServeHTTP(w, r)
				}
			})
		})
	}
}

// resetLine matches httprate's X-RateLimit-Reset field, the Unix second its
// window ends: a row and its replay, a moment apart, may be a second apart.
// Nothing else in either row's answer depends on the clock.
var resetLine = regexp.MustCompile(`X-Ratelimit-Reset: [0-9]+`)

// sameAnswers returns what pair returns (a row's answer and its replay's)
// the first time the two are equal, or the third time they are not. Each
// call sets both up anew; their answers hold what the clock gives them:
// limitplane's denial its retry time to the millisecond from the first
// request's arrival, which the row and its replay's capture each measure
// with their own few microseconds (or, under load, milliseconds) between
// the two requests, and a window peer its remaining count, which a second
// turning between the two requests of one and not the other's changes. A
// difference three runs in a row is the row's answer and not the clock's.
func sameAnswers(pair func() [2]string) [2]string {
	var got [2]string
	for range 3 {
		if got = pair(); got[0] == got[1] {
			break
		}
	}
	return got
}

// TestAnswerReplay checks that each answer: row sends, byte for byte, what
// its row sends (the same wire bytes, admitted and denied, but for the
// second of httprate's window end; see sameAnswers for the clock), so that the difference between the two
// rows is the row's own work.
func TestAnswerReplay(t *testing.T) {
	for fw, rows := range answerTables() {
		if len(rows) != 5 {
			t.Fatalf("%s: %d rows, want bare and two pairs", fw, len(rows))
		}
		for _, rate := range []peerRate{admitRate, denyRate} {
			for i := 1; i < len(rows); i += 2 {
				got := sameAnswers(func() (got [2]string) {
					for j, p := range rows[i : i+2] {
						h := p.wrap(t, okHandler(), rate)
						r := httptest.NewRequest("GET", "/x", nil)
						r.RemoteAddr = clientAddr(1).String()
						w := new(wireWriter)
						for range 2 { // the second is the one compared
							w.reset()
							h.ServeHTTP(w, r)
						}
						got[j] = resetLine.ReplaceAllString(w.buf.String(), "X-Ratelimit-Reset: (the window's end)")
					}
					return got
				})
				if got[0] != got[1] {
					t.Errorf("%s, rate %v: %s wrote\n%q\n%s wrote\n%q", fw, rate, rows[i].name, got[0], rows[i+1].name, got[1])
				}
			}
		}
	}
}

// fiberAnswer is what a Fiber middleware sent for one request: the header
// fields it set (those a bare app's answer does not have as they are),
// whether it called the next handler, and its own status and body.
type fiberAnswer struct {
	fields [][2][]byte
	pass   bool
	status int
	body   []byte
}

// fiberFields returns the fields of h that bare does not have with the
// same value.
func fiberFields(h, bare *fasthttp.ResponseHeader) [][2][]byte {
	var out [][2][]byte
	h.VisitAll(func(k, v []byte) {
		if bare == nil || !bytes.Equal(bare.PeekBytes(k), v) {
			out = append(out, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
		}
	})
	return out
}

// captureFiberAnswer returns the answer Fiber row p gives at r to client
// 1's second request, as captureAnswer does for net/http: the fields of
// its whole response (Fiber's limiter sets its own after the next handler
// returns) less those of the bare row's.
func captureFiberAnswer(tb testing.TB, p fiberPeer, r peerRate) *fiberAnswer {
	tb.Helper()
	second := func(use func(testing.TB, *fiber.App, peerRate), passed *bool) *fasthttp.Response {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		use(tb, app, r)
		app.Get("/x", func(c *fiber.Ctx) error {
			*passed = true
			return c.SendString("ok")
		})
		h, ctx := app.Handler(), fiberPeerCtx()
		ctx.SetRemoteAddr(clientAddr(1))
		h(ctx)
		ctx.Response.Reset()
		*passed = false
		h(ctx)
		return &ctx.Response
	}
	var bare bool
	base := second(fiberPeers[0].use, &bare)
	a := new(fiberAnswer)
	resp := second(p.use, &a.pass)
	a.fields = fiberFields(&resp.Header, &base.Header)
	if !a.pass {
		a.status, a.body = resp.StatusCode(), bytes.Clone(resp.Body())
	}
	return a
}

// fiberReplay is a Fiber middleware that sends a: its fields set as a
// Renderer's are (SetCanonical), then the next handler for an answer that
// passed, else a's status and body.
func fiberReplay(a *fiberAnswer) fiber.Handler {
	return func(c *fiber.Ctx) error {
		h := &c.Response().Header
		for _, f := range a.fields {
			h.SetCanonical(f[0], f[1])
		}
		if a.pass {
			return c.Next()
		}
		c.Response().SetStatusCode(a.status)
		c.Response().SetBody(a.body)
		return nil
	}
}

// fiberAnswerRows is answerRows for Fiber.
func fiberAnswerRows(names ...string) []fiberPeer {
	rows := []fiberPeer{fiberPeers[0]}
	for _, p := range fiberPeers {
		if !slices.Contains(names, p.name) {
			continue
		}
		rows = append(rows, p, fiberPeer{"answer:" + p.name, func(tb testing.TB, app *fiber.App, r peerRate) {
			app.Use(fiberReplay(captureFiberAnswer(tb, p, r)))
		}})
	}
	return rows
}

// BenchmarkPeersFiberAnswers is BenchmarkPeersNetHTTPAnswers for Fiber:
// limitplane and Fiber's limiter, each beside the replay of its own answer.
func BenchmarkPeersFiberAnswers(b *testing.B) {
	rows := fiberAnswerRows("limitplane", "fiberlimiter")
	b.Run("admit", func(b *testing.B) { benchFiberRows(b, rows, admitRate) })
	b.Run("deny", func(b *testing.B) { benchFiberRows(b, rows, denyRate) })
}

// dateLine matches fasthttp's Date field, which can turn a second between
// a row's answer and its replay's (and resetLine Fiber's limiter's
// X-RateLimit-Reset, the seconds to its window's end).
var dateLine = regexp.MustCompile(`Date: [^\r]*`)

// TestFiberAnswerReplay is TestAnswerReplay for Fiber: each answer: row
// sends what its row sends, the whole response (status line, fields, body)
// as fasthttp would write it.
func TestFiberAnswerReplay(t *testing.T) {
	rows := fiberAnswerRows("limitplane", "fiberlimiter")
	if len(rows) != 5 {
		t.Fatalf("%d rows, want bare and two pairs", len(rows))
	}
	for _, rate := range []peerRate{admitRate, denyRate} {
		for i := 1; i < len(rows); i += 2 {
			got := sameAnswers(func() (got [2]string) {
				for j, p := range rows[i : i+2] {
					h, ctx := fiberPeerHandler(t, p.use, rate), fiberPeerCtx()
					ctx.SetRemoteAddr(clientAddr(1))
					for range 2 { // the second is the one compared
						ctx.Response.Reset()
						h(ctx)
					}
					got[j] = dateLine.ReplaceAllString(ctx.Response.String(), "Date: (now)")
					got[j] = resetLine.ReplaceAllString(got[j], "X-Ratelimit-Reset: (the window's end)")
				}
				return got
			})
			if got[0] != got[1] {
				t.Errorf("rate %v: %s wrote\n%q\n%s wrote\n%q", rate, rows[i].name, got[0], rows[i+1].name, got[1])
			}
		}
	}
}

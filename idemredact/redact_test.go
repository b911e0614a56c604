package idemredact

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSecretNamesDefaultReturnsCopy(t *testing.T) {
	t.Parallel()
	names := SecretNamesDefault()
	if len(names) != len(defaultSecretNames) {
		t.Fatalf("SecretNamesDefault() has %d names, want %d", len(names), len(defaultSecretNames))
	}
	names[0] = "changed"
	if defaultSecretNames[0] == "changed" {
		t.Fatal("SecretNamesDefault() returned the package slice, not a copy")
	}
}

func TestRedactorIsSecret(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	tests := []struct {
		name string
		want bool
	}{
		{"Authorization", true},
		{"authorization", true},
		{"Proxy-Authorization", true},
		{"Cookie", true},
		{"Set-Cookie", true},
		{"password", true},
		{"PASSWORD", true},
		{"X-Api-Key", true},
		{"api_key", true},
		{"apiKey", true},
		{"db_password", true},
		{"X-Auth-Token", true},
		{"stripeSecret", true},
		{"refresh-token", true},
		{"card_number", true},
		{"CardNumber", true},
		{"X-Signature", false}, // an HMAC is not a secret, and event ids such as "bad-signature" must stay readable
		{"passwd", true},
		{"tokenizer", true}, // contains "token": names are matched generously
		{"Content-Type", false},
		{"X-Request-Id", false},
		{"amount", false},
		{"user", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := r.IsSecret(tt.name); got != tt.want {
				t.Errorf("IsSecret(%q) = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}

func TestRedactorHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   map[string]string
		want map[string]string
	}{
		{name: "nil", in: nil, want: nil},
		{name: "empty", in: map[string]string{}, want: map[string]string{}},
		{
			name: "case-insensitive names",
			in: map[string]string{
				"Authorization": "Bearer abc.def",
				"AUTHORIZATION": "Basic dXNlcjpwYXNz",
				"cookie":        "sid=1",
				"X-API-KEY":     "k",
				"x-auth-token":  "t",
				"Content-Type":  "application/json",
				"X-Request-Id":  "req-42",
			},
			want: map[string]string{
				"Authorization": Masked,
				"AUTHORIZATION": Masked,
				"cookie":        Masked,
				"X-API-KEY":     Masked,
				"x-auth-token":  Masked,
				"Content-Type":  "application/json",
				"X-Request-Id":  "req-42",
			},
		},
		{
			name: "secrets inside other values",
			in:   map[string]string{"X-Upstream": "postgres://app:pw@db/ledger", "X-Empty": ""},
			want: map[string]string{"X-Upstream": "postgres://app:" + Masked + "@db/ledger", "X-Empty": ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var before map[string]string
			if tt.in != nil {
				before = make(map[string]string, len(tt.in))
				for k, v := range tt.in {
					before[k] = v
				}
			}
			got := New(Config{}).Headers(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Headers() = %v, want %v", got, tt.want)
			}
			if (got == nil) != (tt.want == nil) {
				t.Errorf("Headers() nil = %v, want nil = %v", got == nil, tt.want == nil)
			}
			if !reflect.DeepEqual(tt.in, before) {
				t.Errorf("Headers() modified its input: %v, was %v", tt.in, before)
			}
		})
	}
}

func TestRedactorJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{
			name: "nested objects in arrays, order and numbers kept",
			in: `{"zeta":1.50,"id":"evt-1","items":[{"sku":"A","card_number":"4111111111111111","qty":2},` +
				`{"auth":{"access_token":"at","scope":"read"}}],"big":12345678901234567890,"exp":1e3,` +
				`"Password":{"old":"a","new":"b"},"tokens":["x","y"],"ok":true,"none":null}`,
			want: `{
  "zeta": 1.50,
  "id": "evt-1",
  "items": [
    {
      "sku": "A",
      "card_number": "[REDACTED]",
      "qty": 2
    },
    {
      "auth": {
        "access_token": "[REDACTED]",
        "scope": "read"
      }
    }
  ],
  "big": 12345678901234567890,
  "exp": 1e3,
  "Password": "[REDACTED]",
  "tokens": "[REDACTED]",
  "ok": true,
  "none": null
}`,
		},
		{
			name: "empty containers and escapes",
			in:   ` {"a":{},"b":[],"c":"<&> \"q\" \u00e9\n","d":[[]]} `,
			want: "{\n  \"a\": {},\n  \"b\": [],\n  \"c\": \"<&> \\\"q\\\" é\\n\",\n  \"d\": [\n    []\n  ]\n}",
		},
		{
			name: "array at top level",
			in:   `[{"secret":1},2]`,
			want: "[\n  {\n    \"secret\": \"[REDACTED]\"\n  },\n  2\n]",
		},
		{
			name: "secret patterns inside non-secret strings",
			in:   `{"dsn":"postgres://app:pw@db/x","note":"retry with token=abc"}`,
			want: "{\n  \"dsn\": \"postgres://app:[REDACTED]@db/x\",\n  \"note\": \"retry with token=[REDACTED]\"\n}",
		},
		{
			name: "duplicate keys kept",
			in:   `{"a":1,"a":2}`,
			want: "{\n  \"a\": 1,\n  \"a\": 2\n}",
		},
		{name: "scalar document", in: `-0.0`, want: `-0.0`},
		{name: "invalid JSON falls back to text", in: `{"password":"hunter2"`, want: `{"password":"[REDACTED]"`},
		{name: "plain text falls back to text", in: `user=bob password=hunter2`, want: `user=bob password=[REDACTED]`},
		{name: "two documents are not one", in: `{"a":1} {"token":"t"}`, want: `{"a":1} {"token":"[REDACTED]"}`},
		{name: "empty", in: ``, want: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := string(New(Config{}).JSON([]byte(tt.in))); got != tt.want {
				t.Errorf("JSON(%s) =\n%s\nwant\n%s", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactorJSONDoesNotAliasInput(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	if got := r.JSON(nil); got != nil {
		t.Errorf("JSON(nil) = %q, want nil", got)
	}
	in := []byte("not json at all")
	out := r.JSON(in)
	out[0] = 'X'
	if string(in) != "not json at all" {
		t.Errorf("JSON returned a slice aliasing its input")
	}
}

func TestRedactorText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"key=value", "login failed: password=hunter2", "login failed: password=[REDACTED]"},
		{"key: value", "token: abc", "token: [REDACTED]"},
		{"blanks around separator", "password = hunter2 for bob", "password = [REDACTED] for bob"},
		{"json pair", `bad body {"api_key":"xyz","n":1}`, `bad body {"api_key":"[REDACTED]","n":1}`},
		{"json pair with spaces", `{"secret" : "s 3"}`, `{"secret" : "[REDACTED]"}`},
		{"single quotes", "password='my secret' dbname=x", "password='[REDACTED]' dbname=x"},
		{"escaped json in a string", `body: "{\"token\":\"abc\"}"`, `body: "{\"token\":\"[REDACTED]\"}"`},
		{"unterminated quote", `password="abc def`, `password="[REDACTED] def`},
		{"authorization header", "Authorization: Bearer eyJhbGciOi.eyJzdWIi.sig", "Authorization: Bearer [REDACTED]"},
		{"authorization basic", "authorization=Basic dXNlcjpwYXNz", "authorization=Basic [REDACTED]"},
		{"bearer anywhere", "upstream said 401 for Bearer abc.def-ghi_jkl", "upstream said 401 for Bearer [REDACTED]"},
		{"bearer lower case", "bearer\tabc123", "bearer\t[REDACTED]"},
		{"url userinfo", "dial postgres://user:pass@host/db: refused", "dial postgres://user:[REDACTED]@host/db: refused"},
		{"url with @ in password", "amqp://guest:p@ss@rabbit:5672/vh", "amqp://[REDACTED]@rabbit:5672/vh"},
		{"nats token", "connect nats://s3cr3t@nats:4222", "connect nats://[REDACTED]@nats:4222"},
		{"query parameter", "GET /cb?code=1&access_token=abc&x=2", "GET /cb?code=1&access_token=[REDACTED]&x=2"},
		{"several", "X-Api-Key=k1 db_password=p2, stripeSecret: s3", "X-Api-Key=[REDACTED] db_password=[REDACTED], stripeSecret: [REDACTED]"},
		{"value of a non-secret name", "user=password=x", "user=password=[REDACTED]"},
		{"cookie to end of line", "Cookie: sid=1; csrf=2\nnext", "Cookie: [REDACTED]\nnext"},
		{"already masked", "password=[REDACTED] token: [REDACTED]", "password=[REDACTED] token: [REDACTED]"},
		// A secret name with no separator and value after it is prose, not a secret.
		{"tokenizer failed", "tokenizer failed", "tokenizer failed"},
		{"password prose", `pq: password authentication failed for user "bob"`, `pq: password authentication failed for user "bob"`},
		{"name without value", "missing token:", "missing token:"},
		{"innocent", "insert into ledger: duplicate key (id)=(42) at 12:30:45", "insert into ledger: duplicate key (id)=(42) at 12:30:45"},
		{"url without password", "postgres://app@db/ledger", "postgres://app@db/ledger"},
		{"empty", "", ""},
		// A file path that ends in a secret name is a path, not a name-value pair.
		{"file path", "open /etc/passwd: file is not a database (26)", "open /etc/passwd: file is not a database (26)"},
		{"windows path", `open C:\secrets\token: access denied`, `open C:\secrets\token: access denied`},
		// Erring towards masking: a name containing a secret name masks the value after it.
		{"tokenizer with separator", "tokenizer: bad input", "tokenizer: [REDACTED] input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := New(Config{}).Text(tt.in); got != tt.want {
				t.Errorf("Text(%q) =\n %q\nwant\n %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactorTextTruncation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		max  int
		in   string
		want string
	}{
		{"fits exactly", 5, "héllo", "héllo"},
		{"multibyte cut at rune boundary", 4, "日本語のテキスト", "日本語の" + truncatedMarker},
		{"emoji", 2, "🙂🙂🙂", "🙂🙂" + truncatedMarker},
		{"masking before cut", 12, "password=hunter2 and more", "password=[RE" + truncatedMarker},
		{"zero means default", 0, strings.Repeat("é", MaxErrorLenDefault+1), strings.Repeat("é", MaxErrorLenDefault) + truncatedMarker},
		{"negative means default", -1, strings.Repeat("a", MaxErrorLenDefault), strings.Repeat("a", MaxErrorLenDefault)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := New(Config{MaxErrorLen: tt.max}).Text(tt.in)
			if got != tt.want {
				t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("Text(%q) = %q is not valid UTF-8", tt.in, got)
			}
		})
	}
}

func TestRedactorTextInvalidUTF8(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"lone continuation byte", "a\x80b", "a\uFFFDb"},
		{"truncated sequence", "x\xe6\x97", "x\uFFFD"},
		{"around a secret", "\xffpassword=hunter2 \xfe", "\uFFFDpassword=[REDACTED] \uFFFD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := New(Config{}).Text(tt.in)
			if got != tt.want || !utf8.ValidString(got) {
				t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"postgres", "postgres://app:s3cret@db.internal:5432/ledger?sslmode=require", "postgres://app:[REDACTED]@db.internal:5432/ledger?sslmode=require"},
		{"postgresql with query password", "postgresql://db/ledger?user=app&password=s3cret", "postgresql://db/ledger?user=app&password=[REDACTED]"},
		{"nats user and password", "nats://svc:pw@nats-1:4222", "nats://[REDACTED]@nats-1:4222"},
		{"nats token", "nats://tok123@nats-1:4222", "nats://[REDACTED]@nats-1:4222"},
		{"nats cluster list", "nats://a:p1@n1:4222,nats://b:p2@n2:4222", "nats://[REDACTED]@n1:4222,nats://[REDACTED]@n2:4222"},
		{"amqp", "amqp://guest:guest@rabbit:5672/%2f", "amqp://[REDACTED]@rabbit:5672/%2f"},
		{"amqps percent-encoded", "amqps://u:p%40ss@mq/vh", "amqps://[REDACTED]@mq/vh"},
		{"empty user", "redis://:pw@cache:6379/0", "redis://[REDACTED]@cache:6379/0"},
		{"key=value DSN", "host=db user=app password=s3cret dbname=ledger sslmode=disable", "host=db user=app password=[REDACTED] dbname=ledger sslmode=disable"},
		{"key=value DSN quoted", "host=db password='s3 cret' user=app", "host=db password='[REDACTED]' user=app"},
		{"semicolon DSN", "Server=db;User Id=app;Password=s3cret;Database=ledger", "Server=db;User Id=app;Password=[REDACTED];Database=ledger"},
		{"nothing to mask", "postgres://app@db/ledger", "postgres://app@db/ledger"},
		{"no userinfo", "nats://nats-1:4222", "nats://nats-1:4222"},
		{"sqlite path", "file:/var/lib/idem.db?_pragma=busy_timeout(5000)", "file:/var/lib/idem.db?_pragma=busy_timeout(5000)"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := URL(tt.in); got != tt.want {
				t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactConfigNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		in   map[string]string
		want map[string]string
	}{
		{
			name: "names replace defaults",
			cfg:  Config{Names: []string{"X-Tenant-Key"}},
			in:   map[string]string{"x_tenant_key": "k", "Authorization": "Bearer t", "Password": "p"},
			want: map[string]string{"x_tenant_key": Masked, "Authorization": "Bearer [REDACTED]", "Password": "p"},
		},
		{
			name: "extra extends defaults",
			cfg:  Config{Extra: []string{"iban"}},
			in:   map[string]string{"IBAN": "DE00", "Password": "p", "Amount": "10"},
			want: map[string]string{"IBAN": Masked, "Password": Masked, "Amount": "10"},
		},
		{
			name: "extra extends custom names",
			cfg:  Config{Names: []string{"pin"}, Extra: []string{"otp"}},
			in:   map[string]string{"PIN": "1234", "OTP": "9", "token": "t"},
			want: map[string]string{"PIN": Masked, "OTP": Masked, "token": "t"},
		},
		{
			name: "empty non-nil names mask no names, empty names are ignored",
			cfg:  Config{Names: []string{}, Extra: []string{"", "-_"}},
			in:   map[string]string{"Password": "p", "Amount": "10"},
			want: map[string]string{"Password": "p", "Amount": "10"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := New(tt.cfg).Headers(tt.in); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Headers() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRedactConfigNamesInText(t *testing.T) {
	t.Parallel()
	r := New(Config{Names: []string{"pin"}})
	got := r.Text("pin=1234 password=p")
	if want := "pin=[REDACTED] password=p"; got != want {
		t.Errorf("Text() = %q, want %q", got, want)
	}
}

func TestNilAndZeroRedactor(t *testing.T) {
	t.Parallel()
	def := New(Config{})
	tests := []struct {
		name string
		r    *Redactor
	}{
		{"nil", nil},
		{"zero value", &Redactor{}},
	}
	long := strings.Repeat("x", MaxErrorLenDefault+10)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !tt.r.IsSecret("X-Api-Key") || tt.r.IsSecret("Content-Type") {
				t.Error("IsSecret differs from the default Redactor")
			}
			h := map[string]string{"Authorization": "Bearer t", "Accept": "*/*"}
			if got, want := tt.r.Headers(h), def.Headers(h); !reflect.DeepEqual(got, want) {
				t.Errorf("Headers() = %v, want %v", got, want)
			}
			p := []byte(`{"a":[{"password":"x"}]}`)
			if got, want := string(tt.r.JSON(p)), string(def.JSON(p)); got != want {
				t.Errorf("JSON() = %s, want %s", got, want)
			}
			for _, s := range []string{"password=hunter2", long} {
				if got, want := tt.r.Text(s), def.Text(s); got != want {
					t.Errorf("Text(%.20q) = %.40q, want %.40q", s, got, want)
				}
			}
		})
	}
}

// The Java of a code-interpreter context, hosted by kernel.py as kernel.js is: cells arrive
// on stdin, one JSON line each ({"code", "env"}); the answer to each is one JSON line on the
// pipe whose fd E2B_ANSWER_FD names ({"text"} for a value, {"error": {name, value,
// traceback}}, or {}). Snippets run in this JVM through JShell's local engine; what they
// print goes out on the same pipe as it is written, one {"stream", "text"} line per write,
// so `println` gives its text and its line end as two messages, as E2B's Java kernel does.
//
// As in E2B's Java kernel, variables reach the code as system properties: the sandbox's
// (the environment) from the start, a cell's own for that cell only.
import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;

public class Kernel {
    public static void main(String[] args) throws Exception {
        String fd = System.getenv("E2B_ANSWER_FD");
        PrintStream answers = new PrintStream(
                new FileOutputStream("/proc/self/fd/" + fd), true, StandardCharsets.UTF_8);
        for (Map.Entry<String, String> variable : System.getenv().entrySet()) {
            if (!variable.getKey().equals("E2B_ANSWER_FD")
                    && System.getProperty(variable.getKey()) == null) {
                System.setProperty(variable.getKey(), variable.getValue());
            }
        }
        System.setOut(new Split(new Framed("stdout", answers)));
        System.setErr(new Split(new Framed("stderr", answers)));
        JShell shell = JShell.builder().executionEngine("local").build();
        BufferedReader requests = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = requests.readLine()) != null) {
            Object parsed;
            try {
                parsed = new Json(line).parse();
            } catch (IllegalArgumentException error) {
                answers.println(error("BadRequest", error.getMessage(), ""));
                continue;
            }
            if (!(parsed instanceof Map)) {
                answers.println(error("BadRequest", "a cell is a JSON object", ""));
                continue;
            }
            Map<?, ?> request = (Map<?, ?>) parsed;
            Object code = request.get("code");
            Object env = request.get("env");
            Map<String, String> saved = new HashMap<>();
            if (env instanceof Map) {
                for (Map.Entry<?, ?> variable : ((Map<?, ?>) env).entrySet()) {
                    String key = String.valueOf(variable.getKey());
                    saved.put(key, System.getProperty(key));
                    System.setProperty(key, String.valueOf(variable.getValue()));
                }
            }
            String answer;
            try {
                answer = run(shell, code instanceof String ? (String) code : "");
            } finally {
                System.out.flush();
                System.err.flush();
                for (Map.Entry<String, String> variable : saved.entrySet()) {
                    if (variable.getValue() == null) {
                        System.clearProperty(variable.getKey());
                    } else {
                        System.setProperty(variable.getKey(), variable.getValue());
                    }
                }
            }
            synchronized (answers) {
                answers.println(answer);
            }
        }
    }

    /** Runs a cell snippet by snippet; the answer names the last expression's value. */
    static String run(JShell shell, String code) {
        String remaining = code;
        String text = null;
        while (!remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info =
                    shell.sourceCodeAnalysis().analyzeCompletion(remaining);
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) {
                break;
            }
            String source;
            if (info.completeness().isComplete()) {
                source = info.source();
                remaining = info.remaining();
            } else {
                // Unfinished: JShell's diagnostics say what is missing.
                source = remaining;
                remaining = "";
            }
            text = null;
            for (SnippetEvent event : shell.eval(source)) {
                if (event.causeSnippet() != null) {
                    continue;
                }
                if (event.exception() != null) {
                    return exception(event.exception());
                }
                if (event.status() == Snippet.Status.REJECTED) {
                    StringBuilder message = new StringBuilder();
                    shell.diagnostics(event.snippet()).forEach(diag -> {
                        if (diag.isError()) {
                            if (message.length() > 0) {
                                message.append('\n');
                            }
                            message.append(diag.getMessage(null));
                        }
                    });
                    return error("CompilationException", message.toString(), source.strip());
                }
                Snippet.SubKind kind = event.snippet().subKind();
                boolean shown = kind == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND
                        || kind == Snippet.SubKind.VAR_VALUE_SUBKIND;
                if (shown && event.value() != null) {
                    text = plain(event.value());
                }
            }
        }
        return text == null ? "{}" : "{\"text\":" + quote(text) + "}";
    }

    static String exception(Exception thrown) {
        String name;
        if (thrown instanceof EvalException) {
            name = ((EvalException) thrown).getExceptionClassName();
        } else if (thrown instanceof UnresolvedReferenceException) {
            name = "UnresolvedReferenceException";
        } else {
            name = thrown.getClass().getName();
        }
        StringBuilder trace = new StringBuilder(name);
        if (thrown.getMessage() != null) {
            trace.append(": ").append(thrown.getMessage());
        }
        for (StackTraceElement frame : thrown.getStackTrace()) {
            trace.append("\n\tat ").append(frame);
        }
        String message = thrown.getMessage() == null ? "" : thrown.getMessage();
        return error(name, message, trace.toString());
    }

    static String error(String name, String value, String traceback) {
        return "{\"error\":{\"name\":" + quote(name) + ",\"value\":" + quote(value)
                + ",\"traceback\":" + quote(traceback) + "}}";
    }

    /** JShell shows a string as its literal; the value is the string itself. */
    static String plain(String value) {
        if (value.length() < 2 || value.charAt(0) != '"' || value.charAt(value.length() - 1) != '"') {
            return value;
        }
        StringBuilder out = new StringBuilder();
        for (int i = 1; i < value.length() - 1; i++) {
            char c = value.charAt(i);
            if (c != '\\' || i + 1 >= value.length() - 1) {
                out.append(c);
                continue;
            }
            char next = value.charAt(++i);
            switch (next) {
                case 'n': out.append('\n'); break;
                case 't': out.append('\t'); break;
                case 'r': out.append('\r'); break;
                case 'b': out.append('\b'); break;
                case 'f': out.append('\f'); break;
                case 's': out.append(' '); break;
                case 'u':
                    if (i + 4 < value.length()) {
                        out.append((char) Integer.parseInt(value.substring(i + 1, i + 5), 16));
                        i += 4;
                    }
                    break;
                default:
                    if (next >= '0' && next <= '7') {
                        int code = next - '0';
                        while (i + 1 < value.length() - 1 && code < 32
                                && value.charAt(i + 1) >= '0' && value.charAt(i + 1) <= '7') {
                            code = code * 8 + (value.charAt(++i) - '0');
                        }
                        out.append((char) code);
                    } else {
                        out.append(next);
                    }
            }
        }
        return out.toString();
    }

    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        return out.append('"').toString();
    }

    /**
     * A PrintStream of its own class: `println` then writes its text and its line end
     * separately (PrintStream itself joins them).
     */
    static final class Split extends PrintStream {
        Split(OutputStream out) {
            super(out, true, StandardCharsets.UTF_8);
        }
    }

    /** Each write as one {"stream", "text"} line on the answer pipe. */
    static final class Framed extends OutputStream {
        private final String stream;
        private final PrintStream answers;
        private final CharsetDecoder decoder = StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPLACE)
                .onUnmappableCharacter(CodingErrorAction.REPLACE);
        /** The start of a character split between writes. */
        private ByteBuffer pending = ByteBuffer.allocate(0);

        Framed(String stream, PrintStream answers) {
            this.stream = stream;
            this.answers = answers;
        }

        @Override
        public void write(int b) {
            write(new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public synchronized void write(byte[] bytes, int off, int len) {
            ByteBuffer in = ByteBuffer.allocate(pending.remaining() + len);
            in.put(pending).put(bytes, off, len).flip();
            CharBuffer out = CharBuffer.allocate(in.remaining() + 1);
            decoder.decode(in, out, false);
            pending = in.slice();
            out.flip();
            if (out.hasRemaining()) {
                synchronized (answers) {
                    answers.println("{\"stream\":" + quote(stream) + ",\"text\":"
                            + quote(out.toString()) + "}");
                }
            }
        }
    }

    /** Just enough JSON for a request: objects, arrays, strings, numbers, literals. */
    static final class Json {
        private final String text;
        private int at;

        Json(String text) {
            this.text = text;
        }

        Object parse() {
            Object value = value();
            space();
            if (at != text.length()) {
                throw new IllegalArgumentException("trailing characters in a request");
            }
            return value;
        }

        private void space() {
            while (at < text.length() && Character.isWhitespace(text.charAt(at))) {
                at++;
            }
        }

        private char peek() {
            space();
            if (at >= text.length()) {
                throw new IllegalArgumentException("a request ends early");
            }
            return text.charAt(at);
        }

        private void expect(char c) {
            if (peek() != c) {
                throw new IllegalArgumentException("expected '" + c + "' at " + at);
            }
            at++;
        }

        private Object value() {
            char c = peek();
            if (c == '{') {
                Map<String, Object> object = new LinkedHashMap<>();
                at++;
                if (peek() == '}') {
                    at++;
                    return object;
                }
                while (true) {
                    String key = string();
                    expect(':');
                    object.put(key, value());
                    if (peek() == ',') {
                        at++;
                        continue;
                    }
                    expect('}');
                    return object;
                }
            }
            if (c == '[') {
                List<Object> array = new ArrayList<>();
                at++;
                if (peek() == ']') {
                    at++;
                    return array;
                }
                while (true) {
                    array.add(value());
                    if (peek() == ',') {
                        at++;
                        continue;
                    }
                    expect(']');
                    return array;
                }
            }
            if (c == '"') {
                return string();
            }
            for (String literal : new String[] {"true", "false", "null"}) {
                if (text.startsWith(literal, at)) {
                    at += literal.length();
                    return literal.equals("null") ? null : Boolean.valueOf(literal);
                }
            }
            int start = at;
            while (at < text.length() && "+-0123456789.eE".indexOf(text.charAt(at)) >= 0) {
                at++;
            }
            if (start == at) {
                throw new IllegalArgumentException("unexpected '" + c + "' at " + at);
            }
            return Double.valueOf(text.substring(start, at));
        }

        private String string() {
            expect('"');
            StringBuilder out = new StringBuilder();
            while (true) {
                if (at >= text.length()) {
                    throw new IllegalArgumentException("an unterminated string");
                }
                char c = text.charAt(at++);
                if (c == '"') {
                    return out.toString();
                }
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                if (at >= text.length()) {
                    throw new IllegalArgumentException("an unterminated escape");
                }
                char e = text.charAt(at++);
                switch (e) {
                    case 'n': out.append('\n'); break;
                    case 't': out.append('\t'); break;
                    case 'r': out.append('\r'); break;
                    case 'b': out.append('\b'); break;
                    case 'f': out.append('\f'); break;
                    case 'u':
                        if (at + 4 > text.length()) {
                            throw new IllegalArgumentException("a short \\u escape");
                        }
                        out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
                        at += 4;
                        break;
                    default: out.append(e);
                }
            }
        }
    }
}

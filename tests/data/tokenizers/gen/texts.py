import json, random
random.seed(1234)
T = []
T += ["Hello world", " Hello world", "Hello World!", "HELLO WORLD", "hello\tworld", "Hello\r\nWorld\r\n",
      "The year 2024 was 3.5% better than 1999's.", "I'M here, IT'S ok, we'LL see, THEY'VE gone, you'RE right, I'D go",
      "it'ſ odd", "Kelvin \u212a and it'\u212a", "don't can't won't shouldn't", "rock'n'roll", "''''", "'s'S's",
      "    four spaces", "\t\ttabs", "trailing\t \n", "a\n\n\nb", "a\n \n b", " \n \n ", "\r\r\n\r", "\n\r\n", "x\u000by\u000cz",
      "\u00a0nbsp\u00a0", "ideographic\u3000space", "nel\u0085char", "mongolian\u180evs", "line\u2028sep\u2029para", "zero\u200bwidth", "bom\ufeffchar",
      "\u0000nul\u0000", "\u0001\u007f\u0080\u009f", "tab\there", "   ", "\t", "\n", " \t \n",
      "e\u0301 q\u0301 x\u0308", "\u0301leading mark", "A\u030a and \u212b and \u00c5", "\u2126 ohm", "\ufb01 ligature \uff21\uff22", "\u1100\u1161\u11a8 jamo", "\uac00\u11a8",
      "नमस्ते दुनिया", "สวัสดีครับ", "こんにちは、世界！", "カタカナとひらがな", "中文測試：你好嗎？", "한국어 텍스트입니다", "مرحبا بالعالم", "שלום עולם", "Привет, как дела?", "Ελληνικά κείμενα", "Tiếng Việt có dấu",
      "٣٤٥ Arabic-Indic digits", "½ ¾ ² ³ ⅓ Ⅻ ①", "x² + y³ = z⁴", "1,234,567.89", "0x1F 0b1010 1e-9 -0.0", "v1.2.3-rc.4+build.5",
      "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👍🏿👍🏻", "🇺🇸🇬🇧🇯🇵", "😀😃😄😁😆😅", "❤️‍🔥", "∑∫∂√∞≈≠≤≥", "→←↑↓⇒⇔", "“smart quotes” and ‘single’ — dashes – …",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
      "<|endoftext|>", "<|endoftext|><|endoftext|>", "a<|im_end|>b", " <|im_end|> ", "<|im_start", "<<|im_end|>>", "<|im_end|>|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
      "<think>\n\n</think>\n\n", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>", "<|box_start|>(1,2)<|box_end|>",
      "a" * 1000, "ab" * 500, " " * 300, "\n" * 100, "!" * 257, "=" * 80 + "\n", "1234567890" * 30, "\u4e00" * 200, "😀" * 50,
      "SGVsbG8gV29ybGQhIFRoaXMgaXMgYmFzZTY0IGVuY29kZWQgdGV4dC4gSXQgY2FuIGJlIHF1aXRlIGxvbmcu" * 5,
      "https://www.example.com/path/to/page?query=value&other=123#anchor", "user@example.com", "C:\\Windows\\System32\\drivers\\etc\\hosts",
      "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
      "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
      "const x = async () => { await fetch(`/api/${id}`); };", "SELECT * FROM users WHERE id = 1;", "<div class=\"a\">&nbsp;&lt;b&gt;</div>",
      "| col1 | col2 |\n|------|------|\n| a    | b    |", "- [ ] todo\n- [x] done", "```python\nprint('hi')\n```", "$$\\frac{a}{b} = \\sqrt{c}$$",
      "{\"a\":[1,2,{\"b\":null}],\"c\":\"d\"}", "key: value\nlist:\n  - item", "if (a && b || !c) { x += 1; } else { y -= 2; }", "a->b; c::d; e=>f; g<=h",
      "ŞşĞğİıÇçÖöÜü", "ÆØÅæøå", "ẞß straße STRASSE", "Ǆ ǅ ǆ", "ﬀ ﬁ ﬂ ﬃ ﬄ ﬅ ﬆ", "İstanbul", "ΣΑΣ σας",
      ]
pal = list("abcdefXYZ0123456789       '''\t!?.,-_()[]{}<>|/\\\"#@*+=~`^$%&;:") + ["\n","\r","\n\n"," \n","'s","'S","'ll","'LL","'re","'Ve","'d","'M","'t","<|im_end|>","<|endoftext|>","<tool_call>","<think>","<|im_start"] + list("\u00a0\u3000\u0085\u180e\u2028\u2029\u200b\ufeff\u0301\u0308\u0300\u030a\u094d\u0947\u0928\u092e\u0938\u0e2a\u0e31\u0e35\u4e2d\u6587\u3053\u3093\uac00\u017f\u212a\u212b\u00df\u0663\u00bd\u00b2\u2460\u00e9\u00c5\U0001f600\U0001f44d\U0001f3fd\u200d\u0627\u0644\u05d0\u0410\u044f\u1100\u1161\u11a8\u0000\u0001\u007f\ufb01\uff21")
for i in range(400):
    n = random.randint(1, 40)
    T.append("".join(random.choice(pal) for _ in range(n)))
json.dump(T, open("texts.json", "w"))
print(len(T))

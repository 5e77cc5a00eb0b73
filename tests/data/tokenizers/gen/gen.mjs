import { Tokenizer } from "@huggingface/tokenizers";
import fs from "fs";
const [tokPath, cfgPath, inPath, outPath, parseSpecialArg] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(tokPath, "utf8"));
const cfg = cfgPath === "-" ? {} : JSON.parse(fs.readFileSync(cfgPath, "utf8"));
cfg.clean_up_tokenization_spaces = false;
const tok = new Tokenizer(tj, cfg);
const texts = JSON.parse(fs.readFileSync(inPath, "utf8"));
const cases = texts.map((text) => {
  const ids = tok.encode(text, { add_special_tokens: false }).ids;
  const decoded = tok.decode(ids, { skip_special_tokens: false });
  const decoded_skip = tok.decode(ids, { skip_special_tokens: true });
  return { text, ids, decoded, decoded_skip };
});
fs.writeFileSync(outPath, JSON.stringify({ generator: "@huggingface/tokenizers 0.2.0 (tokenizers.js)", cases }, null, 0));
console.log(cases.length, "cases");

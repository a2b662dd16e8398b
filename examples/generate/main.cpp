// generate: a small decoder-only transformer (decoder.hpp, the user's own model) writes text for
// many concurrent prompts served through hone::serve::dynamic_batcher, with its keys and values in
// hone::serve::kv_cache (paged blocks, reference counts, prefix sharing).
//
// Every client thread sends its prompts one after another; each prompt begins with one of a few
// shared system prompts. A request is one step of one sequence (the prompt, or the token generated
// last); the batcher groups the steps of all clients, and the model runs a batch with one oneTBB
// task per request (continuous batching: sequences join and leave between steps). The same work
// runs three ways:
//   recompute      no KV cache: every step recomputes every position of its sequence;
//   kv             the KV cache, without prefix sharing: each prompt is computed once, each step
//                  computes one position and reads the earlier ones from the cache's blocks;
//   kv+prefix      as kv, and a prompt starts from the cached blocks of the longest cached prefix
//                  (the system prompt, once computed), computing only the rest.
// Decoding is greedy, so the three must write exactly the same tokens: the program checks it
// (exit 1 otherwise) and prints tokens/s and the cache's hit rates for each.
//
// The weights are random (--seed) or trained ones (--weights PATH: a safetensors file or a hone
// checkpoint directory, e.g. what train_tiny.py writes after training the same model in PyTorch).
// --prompts-file takes the prompts from a file instead, and --print-tokens prints every
// generation's token ids (train_tiny.py --check compares them with torch's greedy tokens).
//
//   generate [--clients N] [--prompts N] [--new-tokens N] [--system-prompts N]
//            [--prefix-chars N] [--block-tokens N] [--blocks N] [--modes LIST] [--seed N]
//            [--weights PATH [--heads N]] [--prompts-file FILE] [--print-tokens]
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <hone/serve.hpp>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "decoder.hpp"

namespace {

namespace hs = hone::serve;
using generate_example::decoder;
using generate_example::decoder_config;
using generate_example::past_rows;

enum class mode { recompute, kv, kv_prefix };

const char* name_of(mode m) {
  switch (m) {
    case mode::recompute:
      return "recompute (no KV cache)";
    case mode::kv:
      return "KV cache, no prefix sharing";
    case mode::kv_prefix:
      return "KV cache + prefix sharing";
  }
  return "?";
}

/// One step of one client's sequence.
struct step_request {
  std::size_t client = 0;            // each client has one sequence at a time
  std::vector<hs::kv_token> tokens;  // the prompt (first step), else the token generated last
  bool first = false;                // starts the client's sequence
  bool last = false;                 // the sequence ends with this step's token
};

/// The batch model the batcher serves: the decoder plus, per client, the state of its sequence.
/// The batcher never calls infer() from two threads at once, so the cache (driven by one thread)
/// and the client table need no lock; inside infer() the requests' positions are computed in
/// parallel, reading the cache's blocks but never changing the cache.
class served_decoder {
 public:
  served_decoder(const decoder& net, mode m, hs::kv_cache<float>* cache, std::size_t clients)
      : net_(net), mode_(m), cache_(cache), clients_(clients) {}

  std::vector<hs::kv_token> infer(std::span<const step_request> batch) {
    const decoder_config& c = net_.config();
    const std::size_t kvf = c.kv_floats(), lh = c.layers * c.heads;
    std::vector<work> w(batch.size());
    // 1. (serial) Start sequences, find what each request must compute and the rows it reads.
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const step_request& r = batch[i];
      client& cl = clients_.at(r.client);
      if (r.first) cl.history.clear();
      cl.history.insert(cl.history.end(), r.tokens.begin(), r.tokens.end());
      w[i].cl = &cl;
      if (mode_ == mode::recompute) {
        w[i].start = 0;  // every position again, from contiguous buffers
        w[i].tokens = cl.history;
        w[i].past.reset(lh, cl.history.size());
        continue;
      }
      if (r.first) {
        const std::span<const hs::kv_token> prompt(r.tokens);
        // Look up the prompt without its last token: the model must run on that one to predict
        // the next.
        const hs::kv_prefix_match m = mode_ == mode::kv_prefix
                                          ? cache_->add_sequence(prompt.first(prompt.size() - 1))
                                          : cache_->add_sequence();
        cl.seq = m.seq;
        w[i].tokens.assign(r.tokens.begin() + static_cast<std::ptrdiff_t>(m.cached_tokens),
                           r.tokens.end());
      } else {
        w[i].tokens = r.tokens;
      }
      w[i].start = cache_->length(cl.seq);
      w[i].past.reset(lh, w[i].start + w[i].tokens.size());
      // The cached positions are read in place: block p / block_tokens of the block table, row
      // (layer-head, p % block_tokens) of that block ([head][token][dim] within a block).
      const std::span<const hs::kv_block_id> table = cache_->block_table(cl.seq);
      const std::size_t bt = cache_->shape().block_tokens, hd = c.head_dim();
      for (std::size_t p = 0; p < w[i].start; ++p) {
        const float* kb = cache_->pool().k_data(table[p / bt]);
        const float* vb = cache_->pool().v_data(table[p / bt]);
        for (std::size_t h = 0; h < lh; ++h) {
          w[i].past.k[h * w[i].past.stride + p] = kb + (h * bt + p % bt) * hd;
          w[i].past.v[h * w[i].past.stride + p] = vb + (h * bt + p % bt) * hd;
        }
      }
    }
    // 2. (parallel) Each request's new positions; the cache is only read.
    tbb::parallel_for(std::size_t{0}, batch.size(), [&](std::size_t i) {
      work& x = w[i];
      x.k.resize(x.tokens.size() * kvf);
      x.v.resize(x.tokens.size() * kvf);
      decoder::scratch s;
      for (std::size_t j = 0; j < x.tokens.size(); ++j) {
        x.next = net_.position(x.tokens[j], x.start + j, x.past, x.k.data() + j * kvf,
                               x.v.data() + j * kvf, s);
      }
      x.logit = s.logits[static_cast<std::size_t>(x.next)];
    });
    // 3. (serial) Keep the new K and V, end finished sequences, answer.
    std::vector<hs::kv_token> out(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      positions_ += w[i].tokens.size();
      if (batch[i].first) prompt_positions_ += w[i].tokens.size();
      out[i] = w[i].next;
      client& cl = *w[i].cl;
      if (batch[i].first) cl.logits.clear();
      cl.logits.push_back(w[i].logit);
      if (batch[i].last) cl.done_logits.push_back(std::move(cl.logits));
      if (mode_ == mode::recompute) continue;
      if (!batch[i].last) cache_->append(w[i].cl->seq, w[i].tokens, w[i].k, w[i].v);
      if (batch[i].last) cache_->free_sequence(w[i].cl->seq);
    }
    return out;
  }

  /// Positions computed in all (the model's work) and those of first steps (prompts).
  [[nodiscard]] std::uint64_t positions() const { return positions_; }
  [[nodiscard]] std::uint64_t prompt_positions() const { return prompt_positions_; }
  /// The logit of every token generated for client `c`, per finished sequence in order.
  [[nodiscard]] const std::vector<std::vector<float>>& logits(std::size_t c) const {
    return clients_.at(c).done_logits;
  }

 private:
  struct client {
    std::vector<hs::kv_token> history;  // the tokens of the current sequence (recompute mode)
    hs::kv_seq_id seq = 0;
    std::vector<float> logits;                    // of the current sequence's tokens
    std::vector<std::vector<float>> done_logits;  // of each finished sequence
  };
  struct work {
    client* cl = nullptr;
    std::size_t start = 0;             // position of tokens[0]
    std::vector<hs::kv_token> tokens;  // to compute
    std::vector<float> k, v;           // their K and V, token-major
    past_rows past;                    // rows of positions 0 .. start + tokens.size() - 1
    hs::kv_token next = 0;             // the prediction after the last of them
    float logit = 0;                   // its logit
  };

  const decoder& net_;
  mode mode_;
  hs::kv_cache<float>* cache_;
  std::vector<client> clients_;
  std::uint64_t positions_ = 0, prompt_positions_ = 0;
};

static_assert(hs::check_batch_model<served_decoder, step_request>());

struct options {
  std::size_t clients = 8, prompts = 4, new_tokens = 32, system_prompts = 2, prefix_chars = 128,
              block_tokens = 16, blocks = 0;
  std::uint64_t seed = 1;
  std::vector<mode> modes{mode::recompute, mode::kv, mode::kv_prefix};
  std::string weights;       // trained weights (file or checkpoint directory); empty: random
  std::size_t heads = 0;     // head count of the weights (0: from the file's metadata)
  std::string prompts_file;  // one prompt a line; empty: generated prompts
  bool print_tokens = false;
};

/// The prompts of each client, in the order it sends them.
using prompt_table = std::vector<std::vector<std::string>>;

/// Prompt `k` of client `c`: system prompt (c + k) % system_prompts, then a question of its own.
std::string make_prompt(const options& o, std::size_t c, std::size_t k) {
  static constexpr std::string_view text =
      "You are a careful assistant. Answer briefly and say when you are not sure. Cite the "
      "document you used. Keep numbers exact and units explicit; prefer lists to long prose. ";
  const std::size_t sys = (c + k) % o.system_prompts;
  std::string p = "[system " + std::to_string(sys) + "] ";
  while (p.size() < o.prefix_chars) p += text;
  p.resize(o.prefix_chars);
  std::mt19937_64 rng(o.seed * 1000003u + c * 1009u + k);
  static constexpr std::string_view words[] = {"why",   "does", "the",  "cache",  "block",  "hold",
                                               "token", "keys", "when", "shared", "prefix", "ends"};
  p += "\nQ" + std::to_string(c) + "." + std::to_string(k) + ":";
  for (int i = 0; i < 4; ++i) p += " " + std::string(words[rng() % std::size(words)]);
  p += "?\nA:";
  return p;
}

struct run_result {
  std::vector<std::vector<std::vector<hs::kv_token>>> tokens;  // [client][prompt] generated
  std::vector<std::vector<std::vector<float>>> logits;         // [client][prompt] their logits
  double seconds = 0;
  std::uint64_t positions = 0, prompt_positions = 0, prompt_tokens = 0;
  hs::kv_cache_stats kv{};
  double mean_batch = 0;
};

run_result run(const decoder& net, const options& o, const prompt_table& prompts, mode m) {
  const decoder_config& c = net.config();
  std::unique_ptr<hs::kv_cache<float>> cache;
  if (m != mode::recompute) {
    cache = std::make_unique<hs::kv_cache<float>>(
        hs::kv_block_shape{.block_tokens = o.block_tokens,
                           .heads = c.layers * c.heads,  // one "head" per (layer, head)
                           .head_dim = c.head_dim()},
        o.blocks);
  }
  served_decoder model(net, m, cache.get(), o.clients);
  run_result r;
  r.tokens.resize(o.clients);
  for (std::size_t ci = 0; ci < o.clients; ++ci) r.tokens[ci].resize(prompts[ci].size());
  hs::batcher_stats bs;
  const auto t0 = std::chrono::steady_clock::now();
  {
    hs::dynamic_batcher<served_decoder, step_request> batcher(
        model, {.max_batch_size = o.clients,
                .max_queue_delay = std::chrono::microseconds(200),
                .queue_capacity = o.clients});
    std::vector<std::thread> clients;
    std::vector<std::exception_ptr> errors(o.clients);
    for (std::size_t ci = 0; ci < o.clients; ++ci) {
      clients.emplace_back([&, ci] {
        try {
          for (std::size_t k = 0; k < prompts[ci].size(); ++k) {
            const std::string& prompt = prompts[ci][k];
            std::vector<hs::kv_token>& out = r.tokens[ci][k];
            step_request q{ci, std::vector<hs::kv_token>(prompt.begin(), prompt.end()), true,
                           o.new_tokens == 1};
            for (std::size_t t = 0; t < o.new_tokens; ++t) {
              out.push_back(batcher.submit(std::move(q)).get());
              q = step_request{ci, {out.back()}, false, t + 2 == o.new_tokens};
            }
          }
        } catch (...) {
          errors[ci] = std::current_exception();
        }
      });
    }
    for (auto& t : clients) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    bs = batcher.stats();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t ci = 0; ci < o.clients; ++ci) r.logits.push_back(model.logits(ci));
  r.positions = model.positions();
  r.prompt_positions = model.prompt_positions();
  for (const auto& client_prompts : prompts) {
    for (const std::string& p : client_prompts) r.prompt_tokens += p.size();
  }
  if (cache) {
    r.kv = cache->stats();
    cache->validate();
  }
  r.mean_batch = bs.mean_batch_size;
  return r;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "generate: %s\nusage: generate [--clients N] [--prompts N] [--new-tokens N] "
               "[--system-prompts N] [--prefix-chars N] [--block-tokens N] [--blocks N] "
               "[--modes recompute,kv,kv+prefix] [--seed N] [--weights PATH [--heads N]] "
               "[--prompts-file FILE] [--print-tokens]\n",
               why.c_str());
  std::exit(2);
}

std::size_t parse_count(std::string_view flag, const char* text, std::size_t lo, std::size_t hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < static_cast<long long>(lo) ||
      v > static_cast<long long>(hi)) {
    usage(std::string(flag) + " needs an integer in [" + std::to_string(lo) + ", " +
          std::to_string(hi) + "], got '" + text + "'");
  }
  return static_cast<std::size_t>(v);
}

std::vector<mode> parse_modes(const char* text) {
  std::vector<mode> ms;
  std::string_view s(text);
  while (!s.empty()) {
    const std::string_view item = s.substr(0, s.find(','));
    s.remove_prefix(std::min(s.size(), item.size() + 1));
    if (item == "recompute") {
      ms.push_back(mode::recompute);
    } else if (item == "kv") {
      ms.push_back(mode::kv);
    } else if (item == "kv+prefix") {
      ms.push_back(mode::kv_prefix);
    } else {
      usage("--modes takes a comma-separated list of recompute, kv and kv+prefix, got '" +
            std::string(item) + "'");
    }
  }
  if (ms.empty()) usage("--modes needs at least one of recompute, kv, kv+prefix");
  return ms;
}

/// The prompts of --prompts-file, one a line (a final newline is optional), each sent by client
/// i % clients.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) usage("--prompts-file '" + path + "' cannot be opened");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      usage("--prompts-file '" + path + "': line " + std::to_string(out.size() + 1) +
            " is empty; a prompt needs at least one character");
    }
    out.push_back(line);
  }
  if (out.empty()) usage("--prompts-file '" + path + "' holds no prompt");
  return out;
}

std::string printable(std::span<const hs::kv_token> t) {
  std::string s;
  for (const hs::kv_token x : t) s += (x >= 32 && x < 127) ? static_cast<char>(x) : '.';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  bool blocks_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help") usage("help");
    if (a == "--print-tokens") {
      o.print_tokens = true;
      continue;
    }
    if (i + 1 >= argc) usage("missing value after " + std::string(a));
    const char* v = argv[++i];
    if (a == "--clients") {
      o.clients = parse_count(a, v, 1, 1024);
    } else if (a == "--prompts") {
      o.prompts = parse_count(a, v, 1, 100000);
    } else if (a == "--new-tokens") {
      o.new_tokens = parse_count(a, v, 1, 512);
    } else if (a == "--system-prompts") {
      o.system_prompts = parse_count(a, v, 1, 1000);
    } else if (a == "--prefix-chars") {
      o.prefix_chars = parse_count(a, v, 12, 480);
    } else if (a == "--block-tokens") {
      o.block_tokens = parse_count(a, v, 1, 256);
    } else if (a == "--blocks") {
      o.blocks = parse_count(a, v, 1, std::size_t{1} << 24);
      blocks_given = true;
    } else if (a == "--modes") {
      o.modes = parse_modes(v);
    } else if (a == "--seed") {
      o.seed = parse_count(a, v, 0, std::size_t{1} << 62);
    } else if (a == "--weights") {
      o.weights = v;
    } else if (a == "--heads") {
      o.heads = parse_count(a, v, 1, 4096);
    } else if (a == "--prompts-file") {
      o.prompts_file = v;
    } else {
      usage("unknown flag '" + std::string(a) + "'");
    }
  }

  if (o.heads != 0 && o.weights.empty()) usage("--heads applies to --weights only");
  const decoder net = [&] {
    if (o.weights.empty()) return decoder(decoder_config{}, o.seed);
    try {
      return decoder::load(o.weights, o.heads);
    } catch (const std::exception& e) {  // weights_error, or hone's error reading the file
      std::fprintf(stderr, "generate: %s\n", e.what());
      std::exit(2);
    }
  }();
  const decoder_config& cfg = net.config();

  // The prompts: from the file (prompt i to client i % clients), or made up per client.
  prompt_table prompts;
  if (!o.prompts_file.empty()) {
    const std::vector<std::string> lines = read_prompts(o.prompts_file);
    o.clients = std::min(o.clients, lines.size());
    o.prompts = (lines.size() + o.clients - 1) / o.clients;
    prompts.resize(o.clients);
    for (std::size_t i = 0; i < lines.size(); ++i) prompts[i % o.clients].push_back(lines[i]);
  } else {
    prompts.resize(o.clients);
    for (std::size_t ci = 0; ci < o.clients; ++ci) {
      for (std::size_t k = 0; k < o.prompts; ++k) prompts[ci].push_back(make_prompt(o, ci, k));
    }
  }
  // A sequence never holds more than its prompt and new tokens; each client holds one at a time.
  std::size_t longest = 0, total_prompts = 0;
  for (const auto& client_prompts : prompts) {
    for (const std::string& p : client_prompts) {
      longest = std::max(longest, p.size());
      ++total_prompts;
      for (const char ch : p) {
        const auto t = static_cast<unsigned char>(ch);
        if (t >= cfg.vocab) {
          usage("prompt '" + p + "' has character code " + std::to_string(t) +
                ", outside the model's vocabulary of " + std::to_string(cfg.vocab) + " tokens");
        }
      }
    }
  }
  longest += o.new_tokens;
  if (longest > cfg.max_len) {
    usage("a prompt and its new tokens take " + std::to_string(longest) +
          " positions; the model has " + std::to_string(cfg.max_len) +
          ": lower --prefix-chars or --new-tokens");
  }
  const std::size_t per_seq = (longest + o.block_tokens - 1) / o.block_tokens;
  const std::size_t need = o.clients * per_seq;
  if (!blocks_given) o.blocks = 2 * need;  // as much again for cached prefixes
  if (o.blocks < need) {
    usage("--blocks " + std::to_string(o.blocks) + " cannot hold " + std::to_string(o.clients) +
          " sequences of up to " + std::to_string(longest) + " tokens (" + std::to_string(per_seq) +
          " blocks of " + std::to_string(o.block_tokens) + " each): give at least " +
          std::to_string(need));
  }

  const std::string origin = o.weights.empty() ? "random weights, seed " + std::to_string(o.seed)
                                               : "weights from '" + o.weights + "'";
  std::printf(
      "model: %zu layers, d_model %zu, %zu heads, d_ff %zu, vocabulary %zu, %zu positions "
      "(%s)\n",
      cfg.layers, cfg.d_model, cfg.heads, cfg.d_ff, cfg.vocab, cfg.max_len, origin.c_str());
  if (o.prompts_file.empty()) {
    std::printf(
        "work: %zu clients x %zu prompts, %zu new tokens each; %zu system prompts of %zu "
        "chars; KV cache %zu blocks of %zu tokens (float)\n",
        o.clients, o.prompts, o.new_tokens, o.system_prompts, o.prefix_chars, o.blocks,
        o.block_tokens);
  } else {
    std::printf(
        "work: %zu prompts from '%s' over %zu clients, %zu new tokens each; KV cache %zu blocks "
        "of %zu tokens (float)\n",
        total_prompts, o.prompts_file.c_str(), o.clients, o.new_tokens, o.blocks, o.block_tokens);
  }

  std::vector<run_result> results;
  try {
    for (const mode m : o.modes) results.push_back(run(net, o, prompts, m));
  } catch (const std::exception& e) {  // a request failed (the model's error reaches its client)
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }

  const double generated = static_cast<double>(total_prompts * o.new_tokens);
  std::printf("\n%-28s %9s %10s %18s %14s %12s %10s\n", "mode", "seconds", "tokens/s",
              "positions run", "prompt reused", "prefix hits", "mean batch");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const run_result& r = results[i];
    char reused[32] = "-", hits[32] = "-";
    if (o.modes[i] != mode::recompute) {
      std::snprintf(reused, sizeof reused, "%.1f%%",
                    100.0 * static_cast<double>(r.prompt_tokens - r.prompt_positions) /
                        static_cast<double>(r.prompt_tokens));
    }
    if (o.modes[i] == mode::kv_prefix && r.kv.lookup_tokens > 0) {
      std::snprintf(
          hits, sizeof hits, "%.1f%%",
          100.0 * static_cast<double>(r.kv.hit_tokens) / static_cast<double>(r.kv.lookup_tokens));
    }
    std::printf("%-28s %9.3f %10.1f %18llu %14s %12s %10.2f\n", name_of(o.modes[i]), r.seconds,
                generated / r.seconds, static_cast<unsigned long long>(r.positions), reused, hits,
                r.mean_batch);
  }
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (o.modes[i] == mode::recompute) continue;
    std::printf("%s: KV cache looked up %llu prompt tokens, found %llu; %llu blocks evicted\n",
                name_of(o.modes[i]), static_cast<unsigned long long>(results[i].kv.lookup_tokens),
                static_cast<unsigned long long>(results[i].kv.hit_tokens),
                static_cast<unsigned long long>(results[i].kv.evictions));
  }
  // Prompt i of the file is prompt i / clients of client i % clients.
  const auto file_tokens = [&](std::size_t i) -> const std::vector<hs::kv_token>& {
    return results[0].tokens[i % o.clients][i / o.clients];
  };
  const auto file_prompt = [&](std::size_t i) -> const std::string& {
    return prompts[i % o.clients][i / o.clients];
  };
  if (o.prompts_file.empty()) {
    const std::string& first = prompts[0][0];
    const std::size_t tail = std::min<std::size_t>(first.size(), 24);
    std::printf("\nclient 0, prompt 0: ...%s\ngenerated: %s\n",
                printable(std::vector<hs::kv_token>(first.end() - static_cast<std::ptrdiff_t>(tail),
                                                    first.end()))
                    .c_str(),
                printable(results[0].tokens[0][0]).c_str());
  } else {
    std::printf("\n");
    for (std::size_t i = 0; i < std::min<std::size_t>(total_prompts, 4); ++i) {
      std::printf("prompt %zu: %s|%s\n", i, file_prompt(i).c_str(),
                  printable(file_tokens(i)).c_str());
    }
  }
  if (o.print_tokens) {  // machine-readable: the ids of every generation, by prompt
    for (std::size_t i = 0; i < total_prompts; ++i) {
      const auto& t =
          o.prompts_file.empty() ? results[0].tokens[i / o.prompts][i % o.prompts] : file_tokens(i);
      std::string line = "tokens " + std::to_string(i) + ":";
      for (const hs::kv_token x : t) line += " " + std::to_string(x);
      std::printf("%s\n", line.c_str());
      // The logit of each generated token (9 significant digits: the float exactly).
      const std::size_t ci = o.prompts_file.empty() ? i / o.prompts : i % o.clients;
      const std::size_t k = o.prompts_file.empty() ? i % o.prompts : i / o.clients;
      line = "logits " + std::to_string(i) + ":";
      for (const float x : results[0].logits[ci][k]) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " %.9g", static_cast<double>(x));
        line += buf;
      }
      std::printf("%s\n", line.c_str());
    }
  }

  // The checks: greedy decoding writes the same tokens in every mode (the KV cache's rows and the
  // shared prefixes are the very values recomputation gives), and prefix sharing shared.
  int status = 0;
  for (std::size_t i = 1; i < results.size(); ++i) {
    for (std::size_t ci = 0; ci < o.clients; ++ci) {
      for (std::size_t k = 0; k < prompts[ci].size(); ++k) {
        const auto& a = results[0].tokens[ci][k];
        const auto& b = results[i].tokens[ci][k];
        if (a == b && results[0].logits[ci][k] != results[i].logits[ci][k]) {
          std::fprintf(stderr,
                       "check failed: client %zu, prompt %zu: %s and %s wrote the same tokens with "
                       "different logits (not the same bits)\n",
                       ci, k, name_of(o.modes[0]), name_of(o.modes[i]));
          status = 1;
        }
        if (a != b) {
          const auto at = static_cast<std::size_t>(
              std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin());
          std::fprintf(stderr,
                       "check failed: client %zu, prompt %zu: %s wrote token %zu as %d, %s as %d\n",
                       ci, k, name_of(o.modes[0]), at, a[at], name_of(o.modes[i]), b[at]);
          status = 1;
        }
      }
    }
  }
  for (std::size_t i = 0; i < results.size(); ++i) {
    const hs::kv_cache_stats& s = results[i].kv;
    if (o.modes[i] == mode::kv && s.lookup_tokens != 0) {
      std::fprintf(stderr, "check failed: the run without prefix sharing looked up %llu tokens\n",
                   static_cast<unsigned long long>(s.lookup_tokens));
      status = 1;
    }
    // A client's second prompt comes after its first sequence has ended, when the system prompt's
    // full blocks are registered: there must be hits.
    if (o.modes[i] == mode::kv_prefix && o.prompts_file.empty() && o.prompts >= 2 &&
        o.prefix_chars > o.block_tokens && s.hit_tokens == 0) {
      std::fprintf(stderr, "check failed: prefix sharing found no cached prefix\n");
      status = 1;
    }
  }
  if (status == 0 && results.size() > 1) {
    std::printf("check: all %zu generations are the same in the %zu modes\n", total_prompts,
                results.size());
  }
  return status;
}

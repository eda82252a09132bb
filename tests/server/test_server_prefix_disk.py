"""A server restarted on the same prefix-cache folder answers a long prompt it read before from disk
(the openai SDK, unmodified, sees the cached tokens and the same answer), and the Client drives
the cache's save / load / clear through the real routes."""

import openai

from live_server import serving
from mlx_nb import Client

MODEL = "tiny-llama"
NOTES = "The depot log lists lamp repairs, cedar beams, copper wire and the harbor signal schedule. "


def ask(server, text: str):
    c = openai.OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
    return c.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                     messages=[{"role": "user", "content": text}])


def test_a_restarted_server_reads_a_long_prompt_from_disk(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix-folder")
    option = f"--MLXExtension.prefix_cache_dir={folder}"
    prompt = NOTES * 25 + "\nWhich repairs are due?"
    with serving(tmp_path_factory.mktemp("first"), MODEL, option) as first:
        before = ask(first, prompt)
        assert before.usage.prompt_tokens >= 1000
    # stopped with SIGTERM: the extension closed its engine, which wrote its prefix cache
    with serving(tmp_path_factory.mktemp("second"), MODEL, option) as second:
        after = ask(second, prompt)
        client = Client(second.url, api_key=second.key)
        prefix = client.status()["prefix_cache"]
        assert prefix["hits"]["disk"] == 1 and prefix["disk"]["folder"].startswith(str(folder))
        # as from memory: all but the last prompt token (read for its logits) and one the LRU leaves
        assert after.usage.prompt_tokens_details.cached_tokens == after.usage.prompt_tokens - 2
        assert after.choices[0].message.content == before.choices[0].message.content

        saved = client.prefix_cache("save")
        assert saved["disk"]["entries"] >= 1 and saved["disk"]["unsaved"] == 0
        cleared = client.prefix_cache("clear")
        assert cleared["entries"] >= 1 and "disk_entries" not in cleared
        loaded = client.prefix_cache("load")
        assert loaded["entries"] == loaded["disk"]["entries"] >= 1
        everything = client.prefix_cache("clear", disk=True)
        assert everything["disk_entries"] >= 1 and not list(folder.rglob("*.safetensors"))
        r = second.http.post(f"{second.url}/cache", params={"action": "burn"})
        assert r.status_code == 400 and "save or load" in r.json()["error"]["message"]

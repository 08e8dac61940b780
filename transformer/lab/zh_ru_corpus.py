"""Prints a toy corpus of short Chinese and Russian sentences (about 420 KB, the same every
time), for the attention maps in docs/inside.md:

    python -m transformer.lab.zh_ru_corpus > zh_ru.txt
"""

import random

ZH = (["我们", "他们", "老师", "学生", "小猫", "城市里的人", "我的朋友", "这个程序"],
      ["喜欢", "正在学习", "每天阅读", "慢慢理解", "认真写", "常常讨论"],
      ["中文", "数学", "新的故事", "古老的诗歌", "机器学习", "注意力机制", "春天的风"],
      ["。", "！", "，因为它很有意思。", "，然后休息一下。", "，也想教别人。"])
RU = (["Они", "Учителя", "Студенты", "Кошки", "Люди в городе", "Мои друзья", "Дети"],
      ["любят", "изучают", "каждый день читают", "медленно понимают", "внимательно пишут",
       "часто обсуждают"],
      ["русский язык", "математику", "новую историю", "старые стихи", "машинное обучение",
       "механизм внимания", "весенний ветер"],
      [".", "!", ", потому что это интересно.", ", а потом отдыхают.", " и хотят учить других."])


def main():
    rng = random.Random(0)
    for _ in range(6000):
        if rng.random() < 0.5:
            print("".join(rng.choice(part) for part in ZH))
        else:
            subject, verb, obj, end = (rng.choice(part) for part in RU)
            print(f"{subject} {verb} {obj}{end}")


if __name__ == "__main__":
    main()
